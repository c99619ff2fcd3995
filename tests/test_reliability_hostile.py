"""Hostile input on the lab fleet: host names, variables, probe terms, release args and env with
shell metacharacters run nothing extra anywhere; secrets (``secret_vars``) never reach terminal
output, --json or -vv logs, and the file holding them on a host is 0600; a changed, unknown or
wrong key refuses the host before anything runs on it."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli
from lab_support import LabHandle
from reliability_support import write_spec
from service_cleanup import clean_releases

from fleetctl.secrets import MASK

pytestmark = pytest.mark.lab
TOKEN, PASSWORD = "hf_SECRETVALUE123", "pw-SECRET-456"
TINY = "/root/tiny-env"
FLEETCTL = str(Path(sys.executable).parent / "fleetctl")


def payloads(marker: str) -> list[str]:
    return [f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", f"'; touch {marker}; '",
            f'"; touch {marker}; "', f"\ntouch {marker}\n", f"|| touch {marker} &"]


@pytest.fixture
def marker() -> Iterator[str]:
    path = f"/tmp/fleetctl-pwned-{uuid.uuid4().hex[:8]}"
    yield path
    Path(path).unlink(missing_ok=True)


def markers_found(lab: LabHandle, marker: str) -> list[str]:
    """Where a marker is: the controller's path (the hosts share /tmp) and each host's own /root."""
    found = ["controller"] if Path(marker).exists() else []
    for host in lab.hosts:  # each lab host has its own /root, /opt, /srv, /var/lib/fleetctl
        out = lab.ssh(host, f"ls {marker} /root/{Path(marker).name} 2>/dev/null; true").stdout
        found += [f"{host}:{line}" for line in out.split()]
    return found


def assert_nothing_ran(lab: LabHandle, marker: str) -> None:
    assert markers_found(lab, marker) == []


def hostile_venv(marker: str) -> str:
    """A venv path made of every payload (nested folders where a payload holds a /)."""
    return "/root/hv" + "".join(payloads(marker))


# On a host: a real venv at the hostile path (argv from base64: no shell sees it) holding a package
# whose source carries the payloads as text, with a RECORD, so grep, symbol, import and drift find it.
MAKE_VENV = r"""
import base64, glob, hashlib, os, subprocess, sys
venv, text = (base64.b64decode(a).decode() for a in sys.argv[1:3])
subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", venv], check=True)
site = glob.glob(glob.escape(venv) + "/lib/python3*/site-packages")[0]
files = {"hostilepkg/__init__.py": "", "hostilepkg/spec.py": "class Hostile:\n    NAME = %r\n" % text,
         "hostilepkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hostilepkg\nVersion: 1.0\n",
         "hostilepkg-1.0.dist-info/top_level.txt": "hostilepkg\n"}
rows = []
for rel, body in files.items():
    os.makedirs(os.path.dirname(os.path.join(site, rel)), exist_ok=True)
    with open(os.path.join(site, rel), "w") as f:
        f.write(body)
    digest = base64.urlsafe_b64encode(hashlib.sha256(body.encode()).digest()).rstrip(b"=").decode()
    rows.append("%s,sha256=%s,%d" % (rel, digest, len(body.encode())))
rows.append("hostilepkg-1.0.dist-info/RECORD,,")
with open(os.path.join(site, "hostilepkg-1.0.dist-info/RECORD"), "w") as f:
    f.write("\n".join(rows) + "\n")
print(site)
"""


def make_hostile_venv(lab: LabHandle, host: str, venv: str, text: str) -> str:
    def b64(value: str) -> str:
        return base64.b64encode(value.encode()).decode()

    code = b64(MAKE_VENV)
    return lab.ssh(host, f"echo {code} | base64 -d > /root/.mkvenv.py && /usr/bin/python3 /root/.mkvenv.py "
                         f"{b64(venv)} {b64(text)}").stdout.strip()


def remove_hostile_venv(lab: LabHandle, host: str) -> None:
    lab.ssh(host, "rm -rf /root/hv* /root/.mkvenv.py /root/hostile-*; true")


def hostile_names(marker: str) -> dict[str, str]:
    evil = payloads(marker)
    return {"lab1": f"lab1{evil[0]}", "lab2": evil[1], "lab3": evil[2]}


def hostile_inventory(lab: LabHandle, marker: str) -> Path:
    """The lab's hosts renamed with metacharacters, vars full of them (venv: the hostile venv), two secrets."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    hosts = doc["all"]["children"]["lab"]["hosts"]
    names, evil = hostile_names(marker), payloads(marker)
    renamed = {names[h]: dict(v, note=evil[3], venv=hostile_venv(marker)) for h, v in hosts.items()}
    renamed[names["lab3"]].update(DB_PASS=PASSWORD)
    doc["all"]["children"] = {"lab": {"hosts": renamed, "vars": {
        "secret_vars": ["HF_TOKEN", "DB_PASS"], "HF_TOKEN": TOKEN, "quoted": evil[4], "newline": evil[5]}},
        "third": {"hosts": {names["lab3"]: None}}}
    path = lab.dir / f"inventory-hostile-{Path(marker).name}.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


# A playbook whose paths and values carry the payloads: copy to a hostile folder, a shell task run
# there (chdir and creates are quoted; the command itself is the operator's), a probe and a drift.
PLAYBOOK = """\
- name: hostile
  hosts: lab
  tasks:
    - name: copy a payload into a hostile folder
      copy: {dest: "{{ venv }}/copied.txt", content: "{{ note }}{{ quoted }}"}
    - name: run in a hostile folder
      shell: {cmd: "pwd > /root/hostile-pwd", chdir: "{{ venv }}", creates: "{{ venv }}/nothing{{ note }}"}
    - name: symbol in the hostile venv
      probe: {symbol: Hostile.NAME, package: hostilepkg, venv: "{{ venv }}", expect: present}
    - name: drift of the hostile venv
      drift: {venv: "{{ venv }}", baseline: "%s", verify_files: true}
"""


def test_metacharacters_run_nothing_and_secrets_never_shown(release_free_lab: LabHandle, marker: str,
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every input below passes validation and reaches the hosts (each answer is checked to come from
    them); the payloads arrive as data, and no marker appears on any host or the controller."""
    lab = release_free_lab
    inv = hostile_inventory(lab, marker)
    names = hostile_inventory_names(inv)
    as_named = hostile_names(marker)
    assert sorted(names) == sorted(as_named.values())
    venv, evil = hostile_venv(marker), payloads(marker)
    every = "".join(evil)
    sites = {h: make_hostile_venv(lab, h, venv, every) for h in lab.hosts}
    lab.ssh("lab3", f"rm -rf {TINY} && /usr/bin/python3 -m venv --without-pip {TINY}")
    seen: list[CliRun] = []

    def cli(*args: str, rc: int = 0) -> dict[str, Any]:
        seen.append(run_cli(capsys, "-i", str(inv), *args))
        assert seen[-1].rc == rc, (args, seen[-1].out[-3000:], seen[-1].err[-3000:])
        return seen[-1].json() if "--json" in args else {}

    def ok_everywhere(doc: dict[str, Any], hosts: list[str] = names) -> dict[str, Any]:
        assert sorted(doc["hosts"]) == sorted(hosts)
        assert {h["status"] for h in doc["hosts"].values()} == {"ok"}, doc["hosts"]
        return {name: doc["hosts"][name]["value"] for name in hosts}

    try:
        ok_everywhere(cli("-vv", "ping", "--json"))
        assert {v["stdout"] for v in ok_everywhere(cli("-l", "all", "shell", "--json", "echo ok")).values()} == {"ok\n"}
        facts = ok_everywhere(cli("-vv", "facts", "--json"))
        assert {f["hostname"] for f in facts.values()} == set(lab.hosts)
        # probes: the payloads as grep terms, the hostile venv for grep, symbol, import and script
        grep = ok_everywhere(cli("probe", "grep", *evil, "--package", "hostilepkg", "--venv", venv, "--json"))
        for host, value in grep.items():
            assert json.dumps(value).count("spec.py") >= 1, (host, value)
        symbol = ok_everywhere(cli("probe", "symbol", "Hostile.NAME", "--package", "hostilepkg", "--venv", venv,
                                   "--expect", "present", "--json"))
        assert all(json.dumps(v).count("spec.py") for v in symbol.values()), symbol
        imported = ok_everywhere(cli("probe", "import", "hostilepkg.spec:Hostile.NAME", "--venv", venv,
                                     "--expect", "present", "--json"))
        for host, value in imported.items():
            assert value["imported"] and value["file"].startswith(venv + "/lib/"), (host, value)
            assert value["dist"] == "hostilepkg" and value["python"] == venv + "/bin/python", (host, value)
        script = tmp_path / "echo_args.py"
        script.write_text("import json, os, sys\nprint(json.dumps({'args': json.loads(os.environ['FLEETCTL_ARGS']), "
                          "'python': sys.executable, 'argv': sys.argv[1:]}))\n")
        echoed = ok_everywhere(cli("probe", "script", str(script), "--arg", f"evil={every}", "--venv", venv, "--json"))
        for host, value in echoed.items():
            assert value["json"]["args"] == {"evil": every}, (host, value)
            assert value["json"]["python"].startswith(venv + "/bin/python"), (host, value)
        # drift: the same hostile venv on every host, against a hostile-named baseline, every file verified
        cli("drift", "--venv", venv, "--baseline", names[0], "--verify-files", "--json")
        hosts = cli("-vv", "hosts", "--json")
        row = next(h for h in hosts["hosts"] if h["name"].startswith("`"))
        assert (row["vars"]["HF_TOKEN"], row["vars"]["DB_PASS"]) == (MASK, MASK)
        cli("hosts")
        # run: a playbook with hostile paths and values
        book = tmp_path / "hostile.yml"
        book.write_text(PLAYBOOK % names[0].replace("\\", "\\\\").replace('"', '\\"'))
        cli("run", str(book), "--json")
        for host in lab.hosts:
            copied = lab.ssh(host, f"cat {shlex.quote(venv + '/copied.txt')}").stdout
            assert copied == evil[3] + evil[4], host
            assert lab.ssh(host, "cat /root/hostile-pwd").stdout == venv + "\n", host

        # a release whose args and env carry metacharacters (quotes, ||, backslashes, %, unicode), one
        # arg and one env value from an inventory variable, and a secret from the inventory
        arg = "/m" + evil[1] + evil[2] + evil[3] + evil[6] + " \\ 100% ✓"
        value = evil[0] + evil[1] + evil[2] + evil[3] + evil[4] + evil[6] + " C:\\x41\\ %n $$ ✓"
        spec = write_spec(tmp_path, "hostile", f"""\
            service:
              standin: true
              args: [--model-path, {json.dumps(arg)}, --served-model-name, "{{{{ note }}}}"]
              env: {{HF_TOKEN: "{{{{ HF_TOKEN }}}}", EVIL: {json.dumps(value)}, QUOTED: "{{{{ quoted }}}}"}}
            health: {{timeout: 30, interval: 0.2}}
            """, base=TINY, sglang=False)
        cli("-vv", "-l", "third", "deploy", str(spec), "--check", "--diff")
        assert f"HF_TOKEN='{MASK}'" in seen[-1].out
        cli("-l", "third", "deploy", str(spec), "--check", "--json")
        assert f"HF_TOKEN='{MASK}'" in seen[-1].out
        cli("-vv", "-l", "third", "deploy", str(spec), "--json")
        # on the host: the secret only in service.env (0600), the service got every value literally
        assert lab.ssh("lab3", "stat -c %a /opt/fleetctl/current/service.env").stdout.strip() == "600"
        environ = lab.ssh("lab3", "cat /proc/$(head -1 /var/lib/fleetctl/service/sglang.pid)/environ").stdout
        env = dict(item.split("=", 1) for item in environ.split("\0") if "=" in item)
        assert (env["HF_TOKEN"], env["EVIL"], env["QUOTED"]) == (TOKEN, value, evil[4])
        info = lab.ssh("lab3", "/usr/bin/python3 -c \"import urllib.request as u; print(u.urlopen('http://"
                               f"{lab.addresses['lab3']}:30000/server_info', timeout=5).read().decode())\"").stdout
        assert json.loads(info)["fleetctl_standin"]["launch_args"] == [
            "--model-path", arg, "--served-model-name", evil[3]]
        # a newline (the inventory's `newline`, in env or args): that host's deploy is refused in one line
        # naming the key and the variable (exit 2: a host failed), and its release stays as it was
        for field in ("env: {NL: \"{{ newline }}\"}", "args: [--x, \"{{ newline }}\"]"):
            refused = write_spec(tmp_path, "refused", f"service: {{standin: true, {field}}}\n", base=TINY, sglang=False)
            cli("-l", "third", "deploy", str(refused), rc=2)
            lines = [line for line in seen[-1].err.splitlines() if "cannot be carried" in line]
            assert len(lines) == 1 and "(from host variable newline)" in lines[0], seen[-1].err
            assert lab.ssh("lab3", "readlink /opt/fleetctl/current").stdout.strip().endswith(
                "/" + json.loads(info)["fleetctl_standin"]["release"]), "the refused release was switched to"
        # http: a path with shell payloads (no spaces: ${IFS}), answered by the service just deployed
        path = f"/server_info?a=$(touch${{IFS}}{marker})&b=`touch${{IFS}}{marker}`&c=;touch${{IFS}}{marker}|x"
        http = cli("-l", "third", "probe", "http", path, "--expect-status", "200", "--json")
        answer = ok_everywhere(http, [as_named["lab3"]])[as_named["lab3"]]
        assert answer["status"] == 200 and answer["path"] == path, answer
        cli("-vv", "-l", "third", "status", "--json")
        # -vv debug logging in a real process (in-process runs share pytest's logging handlers)
        for args in (["hosts"], ["-l", "third", "deploy", str(spec), "--json"]):
            proc = subprocess.run([FLEETCTL, "-vv", "-i", str(inv), *args], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[-2000:]
            assert "DEBUG" in proc.stderr or args == ["hosts"]  # paramiko's debug log of the connection
            seen.append(CliRun(proc.returncode, proc.stdout, proc.stderr))
        cli("-vv", "-l", "third", "rollback", rc=2)  # nothing to roll back to: refused, said so
        # the check can see a marker: one made on purpose (shell runs shell) is found where it was made
        control = f"{marker}-control"
        cli("-l", "third", "shell", f"touch /root/{Path(control).name}")
        assert markers_found(lab, control) == [f"lab3:/root/{Path(control).name}"]
    finally:
        lab.ssh("lab3", clean_releases("/opt/fleetctl", TINY))
        for host in lab.hosts:
            lab.ssh(host, f"rm -f /root/{Path(marker).name}-control; true")
            remove_hostile_venv(lab, host)
        inv.unlink()
    assert all(site.startswith(venv + "/lib/python3") for site in sites.values()), sites
    for r in seen:
        assert TOKEN not in r.out + r.err and PASSWORD not in r.out + r.err, (r.out + r.err)[-2000:]
    assert_nothing_ran(lab, marker)


def hostile_inventory_names(path: Path) -> list[str]:
    return list(yaml.safe_load(path.read_text())["all"]["children"]["lab"]["hosts"])


def test_host_key_changed_unknown_or_wrong_user_key_runs_nothing(scratch_lab: LabHandle, marker: str,
                                                               tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    lab = scratch_lab
    touch = f"touch {marker}"
    # unknown host key: an empty known_hosts
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["all"]["vars"] = {"fleetctl_known_hosts": str(tmp_path / "empty_known_hosts")}
    for host in doc["all"]["children"]["lab"]["hosts"].values():
        host["ansible_ssh_private_key_file"] = str(lab.key_path)
    unknown = tmp_path / "inventory.yml"
    unknown.write_text(yaml.safe_dump(doc))
    r = run_cli(capsys, "-i", str(unknown), "-l", "all", "shell", "--json", touch)
    assert r.rc == 2 and {h["status"] for h in r.json()["hosts"].values()} == {"unreachable"}
    assert all("unknown host key ssh-ed25519 SHA256:" in h["reason"] for h in r.json()["hosts"].values())
    # wrong user key
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    r = run_cli(capsys, "-i", str(lab.inventory_path), "-e", f"ansible_ssh_private_key_file={other}", "-l", "all",
                "shell", "--json", touch)
    assert r.rc == 2 and all(h["reason"].startswith("authentication failed for root@")
                             for h in r.json()["hosts"].values())
    # changed host key: lab1 refused, lab2 (unchanged) runs, the marker only there
    lab.rekey("lab1")
    r = run_cli(capsys, "-i", str(lab.inventory_path), "-l", "all", "shell", "--json",
                f"touch /root/{Path(marker).name}")
    hosts = r.json()["hosts"]
    assert r.rc == 2 and hosts["lab1"]["status"] == "unreachable" and hosts["lab2"]["status"] == "ok"
    assert f"HOST KEY CHANGED for {lab.addresses['lab1']}" in hosts["lab1"]["reason"]
    lab.restore("lab1")
    assert lab.ssh("lab2", f"ls /root/{Path(marker).name}").returncode == 0
    assert lab.ssh("lab1", f"ls /root/{Path(marker).name} 2>/dev/null; true").stdout == ""
    assert not Path(marker).exists()
