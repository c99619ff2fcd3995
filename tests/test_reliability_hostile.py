"""Hostile input on the lab fleet: host names, variables, probe terms, release args and env with
shell metacharacters run nothing extra anywhere; secrets (``secret_vars``) never reach terminal
output, --json or -vv logs, and the file holding them on a host is 0600; a changed, unknown or
wrong key refuses the host before anything runs on it."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cli_support import CliRun, run_cli
from lab_support import LabHandle
from reliability_support import write_spec

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


def assert_nothing_ran(lab: LabHandle, marker: str) -> None:
    assert not Path(marker).exists()
    for host in lab.hosts:  # each lab host has its own /root, /opt, /srv, /var/lib/fleetctl
        assert lab.ssh(host, f"ls {marker} /root/{Path(marker).name} 2>/dev/null; true").stdout == "", host


def hostile_inventory(lab: LabHandle, marker: str) -> Path:
    """The lab's hosts renamed with metacharacters, vars full of them, and two secrets."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    hosts = doc["all"]["children"]["lab"]["hosts"]
    evil = payloads(marker)
    names = {"lab1": f"lab1{evil[0]}", "lab2": evil[1], "lab3": evil[2]}
    renamed = {names[h]: dict(v, note=evil[3], venv=f"/root/ml-env{evil[0]}") for h, v in hosts.items()}
    renamed[names["lab3"]].update(DB_PASS=PASSWORD, venv=TINY)
    doc["all"]["children"] = {"lab": {"hosts": renamed, "vars": {
        "secret_vars": ["HF_TOKEN", "DB_PASS"], "HF_TOKEN": TOKEN, "quoted": evil[4], "newline": evil[5]}},
        "third": {"hosts": {names["lab3"]: None}}}
    path = lab.dir / f"inventory-hostile-{Path(marker).name}.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_metacharacters_run_nothing_and_secrets_never_shown(release_free_lab: LabHandle, marker: str,
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = release_free_lab
    inv = hostile_inventory(lab, marker)
    lab.ssh("lab3", f"rm -rf {TINY} && /usr/bin/python3 -m venv --without-pip {TINY}")
    seen: list[CliRun] = []

    def cli(*args: str) -> CliRun:
        seen.append(run_cli(capsys, "-i", str(inv), *args))
        return seen[-1]

    evil = payloads(marker)
    try:
        assert cli("-vv", "ping", "--json").rc == 0, seen[-1].err
        assert sorted(seen[-1].json()["hosts"]) == sorted(hostile_inventory_names(inv))
        assert cli("shell", "--json", "echo ok").rc == 0
        assert cli("-vv", "facts", "--json").rc in (0, 2)
        assert cli("-l", "lab", "probe", "grep", *evil, "--venv", "/root/ml-env", "--json").rc in (0, 1)
        every = "".join(evil)
        cli("-l", "third", "probe", "symbol", f"SpeculativeAlgorithm{every}", "--venv", "/root/ml-env")
        cli("-l", "third", "probe", "import", f"os{every}", "--venv", "/root/ml-env")
        cli("-l", "third", "probe", "http", f"/health{every}", "--timeout", "2")
        cli("-l", "third", "drift", "--venv", f"/root/ml-env{evil[0]}")
        hosts = cli("-vv", "hosts", "--json").json()
        row = next(h for h in hosts["hosts"] if h["name"].startswith("`"))
        assert (row["vars"]["HF_TOKEN"], row["vars"]["DB_PASS"]) == (MASK, MASK)
        cli("hosts")

        # a release whose args and env carry metacharacters, and a secret from the inventory
        spec = write_spec(tmp_path, "hostile", f"""\
            service:
              standin: true
              args: [--model-path, {json.dumps("/m" + evil[1] + evil[2])}]
              env: {{HF_TOKEN: "{{{{ HF_TOKEN }}}}", EVIL: {json.dumps(evil[0] + evil[1] + evil[2] + evil[4])}}}
            health: {{timeout: 30, interval: 0.2}}
            """, base=TINY, sglang=False)
        check = cli("-vv", "-l", "third", "deploy", str(spec), "--check", "--diff")
        assert check.rc == 0, check.out + check.err
        assert f"HF_TOKEN='{MASK}'" in check.out
        assert cli("-l", "third", "deploy", str(spec), "--check", "--json").rc == 0
        assert f"HF_TOKEN='{MASK}'" in seen[-1].out
        done = cli("-vv", "-l", "third", "deploy", str(spec), "--json")
        assert done.rc == 0, done.out + done.err
        # on the host: the secret only in service.env (0600), the service got every value literally
        assert lab.ssh("lab3", "stat -c %a /opt/fleetctl/current/service.env").stdout.strip() == "600"
        environ = lab.ssh("lab3", "cat /proc/$(head -1 /var/lib/fleetctl/service/sglang.pid)/environ").stdout
        env = dict(item.split("=", 1) for item in environ.split("\0") if "=" in item)
        assert env["HF_TOKEN"] == TOKEN and env["EVIL"] == evil[0] + evil[1] + evil[2] + evil[4]
        info = lab.ssh("lab3", "/usr/bin/python3 -c \"import urllib.request as u; print(u.urlopen('http://"
                               f"{lab.addresses['lab3']}:30000/server_info', timeout=5).read().decode())\"").stdout
        assert json.loads(info)["fleetctl_standin"]["launch_args"] == ["--model-path", "/m" + evil[1] + evil[2]]
        assert cli("-vv", "-l", "third", "status", "--json").rc == 0
        # -vv debug logging in a real process (in-process runs share pytest's logging handlers)
        for args in (["hosts"], ["-l", "third", "deploy", str(spec), "--json"]):
            proc = subprocess.run([FLEETCTL, "-vv", "-i", str(inv), *args], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr[-2000:]
            assert "DEBUG" in proc.stderr or args == ["hosts"]  # paramiko's debug log of the connection
            seen.append(CliRun(proc.returncode, proc.stdout, proc.stderr))
        assert cli("-vv", "-l", "third", "rollback").rc == 2  # nothing to roll back to: refused, said so
    finally:
        lab.ssh("lab3", "f=/var/lib/fleetctl/service/sglang.pid; [ -f $f ] && kill -9 $(head -1 $f); "
                        f"rm -rf /opt/fleetctl /var/lib/fleetctl {TINY}; true")
        inv.unlink()
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
    r = run_cli(capsys, "-i", str(unknown), "shell", "--json", touch)
    assert r.rc == 2 and {h["status"] for h in r.json()["hosts"].values()} == {"unreachable"}
    assert all("unknown host key ssh-ed25519 SHA256:" in h["reason"] for h in r.json()["hosts"].values())
    # wrong user key
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    r = run_cli(capsys, "-i", str(lab.inventory_path), "-e", f"ansible_ssh_private_key_file={other}", "shell",
                "--json", touch)
    assert r.rc == 2 and all(h["reason"].startswith("authentication failed for root@")
                             for h in r.json()["hosts"].values())
    # changed host key: lab1 refused, lab2 (unchanged) runs, the marker only there
    lab.rekey("lab1")
    r = run_cli(capsys, "-i", str(lab.inventory_path), "shell", "--json", f"touch /root/{Path(marker).name}")
    hosts = r.json()["hosts"]
    assert r.rc == 2 and hosts["lab1"]["status"] == "unreachable" and hosts["lab2"]["status"] == "ok"
    assert f"HOST KEY CHANGED for {lab.addresses['lab1']}" in hosts["lab1"]["reason"]
    lab.restore("lab1")
    assert lab.ssh("lab2", f"ls /root/{Path(marker).name}").returncode == 0
    assert lab.ssh("lab1", f"ls /root/{Path(marker).name} 2>/dev/null; true").stdout == ""
    assert not Path(marker).exists()
