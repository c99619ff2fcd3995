"""As the lab's non-root user fleetop, without become: read-only commands work (the drift hash cache
in ~/.cache/fleetctl), write commands are refused before any change in one line, and a user whose
fleetctl_root / fleetctl_state_dir are its own folders deploys and rolls back for real."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle, user_inventory
from service_cleanup import clean_releases

from fleetctl.inventory import load_inventory
from fleetctl.release.service import HostLayout, unit
from fleetctl.release.spec import load_spec
from fleetctl.transport.fleet import Fleet

pytestmark = pytest.mark.lab
ENV = "/srv/nonroot-env"  # a venv root made, readable by fleetop
# A distribution only lab1's venv has: an overlay onto lab2 has something to write.
FAKE_DIST = r"""
import base64, hashlib, os, sys, sysconfig
site = sysconfig.get_paths(vars={"base": sys.argv[1], "platbase": sys.argv[1]})["purelib"]
files = {"nonrootpkg/__init__.py": b"VALUE = 1\n",
         "nonrootpkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: nonrootpkg\nVersion: 1.0\n",
         "nonrootpkg-1.0.dist-info/INSTALLER": b"pip\n"}
rows = []
for rel, data in files.items():
    os.makedirs(os.path.dirname(os.path.join(site, rel)), exist_ok=True)
    with open(os.path.join(site, rel), "wb") as handle:
        handle.write(data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    rows.append("%s,sha256=%s,%d" % (rel, digest, len(data)))
rows.append("nonrootpkg-1.0.dist-info/RECORD,,")
with open(os.path.join(site, "nonrootpkg-1.0.dist-info/RECORD"), "w") as handle:
    handle.write("\n".join(rows) + "\n")
"""
OWN = {"fleetctl_root": "/home/fleetop/fleetctl", "fleetctl_state_dir": "/home/fleetop/state",
       "service_port": 30077}  # its own port: a root release of another test may serve 30000
STOP_OWN = clean_releases("/home/fleetop/fleetctl", "/home/fleetop/.cache", "/srv/new-env",
                          state="/home/fleetop/state", boot=False)


@pytest.fixture(scope="module")
def nonroot_lab(lab_fleet: LabHandle) -> Iterator[LabHandle]:
    for host in lab_fleet.hosts:
        lab_fleet.ssh(host, f"test -x {ENV}/bin/python || python3 -m venv {ENV}; {STOP_OWN}")
    lab_fleet.ssh("lab1", f"{ENV}/bin/python -c '{FAKE_DIST}' {ENV}")
    yield lab_fleet
    for host in lab_fleet.hosts:
        lab_fleet.ssh(host, f"{STOP_OWN}; rm -rf {ENV}")


def fingerprint(lab: LabHandle, host: str) -> str:
    """Every path (mode, owner; content or link target) fleetctl could write: release root, state
    folder, the venv, fleetop's home (its own caches left out)."""
    cmd = (f"cd / && find opt var/lib/fleetctl {ENV.lstrip('/')} home/fleetop srv -path home/fleetop/.cache -prune "
           "-o -not -name '*.pyc' -printf '%p %m %u %l\\n' 2>/dev/null | sort; "
           f"find opt var/lib/fleetctl {ENV.lstrip('/')} -type f -not -name '*.pyc' -exec sha256sum {{}} + "
           "2>/dev/null | sort")
    return lab.ssh(host, cmd).stdout


def cli(capsys: pytest.CaptureFixture[str], inventory: Path, *args: str):  # type: ignore[no-untyped-def]
    return run_cli(capsys, "-i", str(inventory), *args)


def failure_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if ": failed: " in line]


def test_read_only_commands_work_as_fleetop(nonroot_lab: LabHandle, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    inv = user_inventory(nonroot_lab, tmp_path / "inv.yml")
    before = fingerprint(nonroot_lab, "lab2")
    facts = cli(capsys, inv, "-l", "lab2", "facts", "--json")
    assert facts.rc == 0, facts.err
    assert cli(capsys, inv, "-l", "lab2", "probe", "import", "pip", "--venv", ENV).rc == 0
    time.sleep(2.1)  # the venv's files have been still for 2 s: the grep cache trusts their stat only then
    greps = [cli(capsys, inv, "-l", "lab2", "probe", "grep", "def main", "--package", "pip", "--venv", ENV, "--json")
             for _ in range(2)]  # the second reads no file: fleetop's own grep cache answers for them
    assert [g.rc for g in greps] == [0, 0], greps[0].err
    first, second = (g.json()["hosts"]["lab2"]["value"] for g in greps)
    assert second["counts"] == first["counts"] and second["files"] == first["files"] and first["counts"]["def main"]
    assert second["cached_files"] == second["searched_files"] + second["binary_files"] > 0
    status = cli(capsys, inv, "-l", "lab2", "status", "--json")
    assert status.rc == 0, status.err
    assert cli(capsys, inv, "-l", "lab2", "releases", "list").rc == 0
    runs = []
    for _ in range(2):  # the second run is answered from the hash cache fleetop keeps
        r = cli(capsys, inv, "-l", "lab2", "drift", "--venv", ENV, "--verify-files", "--json")
        assert r.rc == 0, r.err
        runs.append(r.json()["hosts"]["lab2"]["files"])
    assert runs[1]["checked"] == runs[0]["checked"] > 0
    assert runs[1]["cache_hits"] == runs[1]["checked"] and runs[1]["cache_misses"] == 0
    cached = nonroot_lab.ssh("lab2", "ls /home/fleetop/.cache/fleetctl/cache", user="fleetop").stdout.split()
    assert [n for n in cached if n.startswith("hashes-")] and [n for n in cached if n.startswith("grep-")]
    # the agent's compiled module code is kept in fleetop's own private folder, for the next command
    code = nonroot_lab.ssh("lab2", "stat -c '%U %a' /home/fleetop/.cache/fleetctl/code && "
                           "ls /home/fleetop/.cache/fleetctl/code", user="fleetop").stdout.split()
    assert code[:2] == ["fleetop", "700"] and [n for n in code[2:] if n.endswith(".code")]
    assert fingerprint(nonroot_lab, "lab2") == before  # nothing written outside fleetop's cache


def test_write_commands_are_refused_before_any_change(nonroot_lab: LabHandle, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    inv = user_inventory(nonroot_lab, tmp_path / "inv.yml")
    spec = tmp_path / "plain.yml"
    spec.write_text(f'name: nonroot\nversion: "1"\nbase: {{adopt: {ENV}}}\nservice: {{standin: true}}\n')
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("pip\n")
    hint = "run with --become (-b)"
    lock_line = (f"cannot write /var/lib/fleetctl (deploy lock) as fleetop: {hint} "
                 "or set fleetctl_state_dir to a folder fleetop owns")
    site = nonroot_lab.ssh("lab2", f"{ENV}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'"
                           ).stdout.strip()
    commands = {
        ("deploy", str(spec)): [f"lab2: failed: {lock_line}", f"lab3: failed: {lock_line}"],
        ("rollback",): [f"lab2: failed: {lock_line}", f"lab3: failed: {lock_line}"],
        ("venv", "create", "--venv", "/srv/new-env", "--requirements", str(reqs)):
            [f"lab2: failed: cannot write /srv/new-env (the venv) as fleetop: {hint}",
             f"lab3: failed: cannot write /srv/new-env (the venv) as fleetop: {hint}"],
    }
    before = {h: fingerprint(nonroot_lab, h) for h in ("lab2", "lab3")}
    for args, lines in commands.items():
        r = cli(capsys, inv, "-l", "lab2,lab3", *args)
        assert r.rc == 2, (args, r.out, r.err)
        assert failure_lines(r.err) == lines, (args, r.err)
        assert "Traceback" not in r.err + r.out and "Errno" not in r.err + r.out
    r = cli(capsys, inv, "-l", "lab2", "venv", "overlay", "--from", "lab1", "--venv", ENV)
    assert r.rc == 2, (r.out, r.err)
    assert failure_lines(r.err) == [f"lab2: failed: cannot write {site} (the venv's site-packages) as fleetop: {hint}"]
    assert {h: fingerprint(nonroot_lab, h) for h in ("lab2", "lab3")} == before


def test_one_host_refused_the_others_deploy(nonroot_lab: LabHandle, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    inv = user_inventory(nonroot_lab, tmp_path / "inv.yml", host_vars={"lab3": OWN})
    spec = tmp_path / "plain.yml"
    spec.write_text(f'name: nonroot\nversion: "1"\nbase: {{adopt: {ENV}}}\nservice: {{standin: true}}\n'
                    "health: {timeout: 15, interval: 0.2}\n")
    try:
        r = cli(capsys, inv, "-l", "lab2,lab3", "deploy", str(spec), "--json")
        assert r.rc == 2
        hosts = r.json()["hosts"]
        assert hosts["lab2"]["status"] == "failed"
        assert hosts["lab2"]["reason"].startswith("cannot write /var/lib/fleetctl (deploy lock) as fleetop")
        assert hosts["lab3"]["status"] == "ok" and hosts["lab3"]["value"]["outcome"] == "deployed"
    finally:
        nonroot_lab.ssh("lab3", STOP_OWN)


def test_fleetop_with_its_own_folders_deploys_and_rolls_back(nonroot_lab: LabHandle, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    inv = user_inventory(nonroot_lab, tmp_path / "inv.yml", host_vars={"lab2": OWN})
    specs = []
    for version in ("1", "2"):
        spec = tmp_path / f"own-{version}.yml"
        spec.write_text(f'name: own\nversion: "{version}"\nbase: {{adopt: {ENV}}}\nservice: {{standin: true}}\n'
                        "health: {timeout: 15, interval: 0.2}\n")
        specs.append(spec)
    try:
        for spec in specs:
            r = cli(capsys, inv, "-l", "lab2", "deploy", str(spec), "--json")
            assert r.rc == 0, r.err
        first = r.json()["hosts"]["lab2"]["value"]["previous"]
        r = cli(capsys, inv, "-l", "lab2", "rollback", "--json")
        assert r.rc == 0, r.err
        status = cli(capsys, inv, "-l", "lab2", "status", "--json").json()["hosts"]["lab2"]["value"]
        assert status["current"] == first and status["health"] == "200"
        owner = nonroot_lab.ssh("lab2", "stat -c %U /home/fleetop/fleetctl/releases/* /home/fleetop/state/state.json"
                                ).stdout.split()
        assert set(owner) == {"fleetop"}
        pid = nonroot_lab.ssh("lab2", "head -1 /home/fleetop/state/service/sglang.pid").stdout.strip()
        uid = nonroot_lab.ssh("lab2", f"grep ^Uid: /proc/{pid}/status").stdout.split()[1]
        assert uid == "2400"
    finally:
        nonroot_lab.ssh("lab2", STOP_OWN)


def test_a_permission_error_past_the_checks_is_one_line(nonroot_lab: LabHandle, tmp_path: Path) -> None:
    inv = load_inventory(user_inventory(nonroot_lab, tmp_path / "inv.yml"))
    build = {"op": "build", "root": "/root/x", "state_dir": "/root/x", "release_id": "x",
             "manifest": {"spec_digest": "d"}}  # build checks nothing itself: the lock op did
    with Fleet(inv, inv.select("lab2")) as fleet:
        results = fleet.map(lambda ctx: ctx.call("release_host", build))
    assert results["lab2"].status == "failed"
    assert results["lab2"].reason == "cannot write /root/x as fleetop: run with --become (-b)"


def test_a_restart_that_fails_after_the_switch_is_switched_back(nonroot_lab: LabHandle, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """v2 asks for systemd, which fleetop may not drive: its restart is refused after the switch
    (the lock's check knows only the host's manager). The host goes back to v1, which serves."""
    inv = user_inventory(nonroot_lab, tmp_path / "inv.yml", host_vars={"lab2": OWN})
    good, bad = tmp_path / "good.yml", tmp_path / "bad.yml"
    good.write_text(f'name: rs\nversion: "1"\nbase: {{adopt: {ENV}}}\nservice: {{standin: true}}\n'
                    "health: {timeout: 15, interval: 0.2}\n")
    bad.write_text(f'name: rs\nversion: "2"\nbase: {{adopt: {ENV}}}\nservice: {{standin: true, manager: systemd}}\n'
                   "health: {timeout: 15, interval: 0.2}\n")
    try:
        assert cli(capsys, inv, "-l", "lab2", "deploy", str(good)).rc == 0
        v1 = load_spec(good).release_id
        r = cli(capsys, inv, "-l", "lab2", "deploy", str(bad), "--json")
        assert r.rc == 2
        lab2 = r.json()["hosts"]["lab2"]
        assert lab2["reason"] == ("restart failed: cannot write /etc/systemd/system/sglang.service (systemd unit) "
                                  f"as fleetop: run with --become (-b); rolled back to {v1}")
        assert lab2["value"]["outcome"] == "rolled-back" and lab2["value"]["rollback_gates"][-1]["ok"] is True
        assert nonroot_lab.ssh("lab2", "readlink /home/fleetop/fleetctl/current").stdout.strip() == f"releases/{v1}"
        info = nonroot_lab.ssh("lab2", "/usr/bin/python3 -c \"import urllib.request as u; print(u.urlopen("
                                       f"'http://{nonroot_lab.addresses['lab2']}:30077/server_info', "
                                       "timeout=5).read().decode())\"").stdout
        assert json.loads(info)["fleetctl_standin"]["release"] == v1
        state = json.loads(nonroot_lab.ssh("lab2", "cat /home/fleetop/state/state.json").stdout)
        assert state["current"] == v1
        assert state["history"][-1]["reason"] == f"restart failed for {load_spec(bad).release_id}"
    finally:
        nonroot_lab.ssh("lab2", STOP_OWN)


def test_service_user_runs_the_server_as_fleetop(nonroot_lab: LabHandle, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Deployed as root with service.user fleetop: the server's process is fleetop's (its Uid on
    the host), service.env is root:fleetop 0640, and it serves."""
    where = {"fleetctl_root": "/srv/userrel", "fleetctl_state_dir": "/srv/userstate", "service_port": 30078}
    inv = user_inventory(nonroot_lab, tmp_path / "inv.yml", user="root", host_vars={"lab3": where})
    spec = tmp_path / "as-user.yml"
    spec.write_text(f'name: asuser\nversion: "1"\nbase: {{adopt: {ENV}}}\n'
                    "service: {standin: true, user: fleetop, env: {SECRET_THING: s3cret}}\n"
                    "health: {timeout: 15, interval: 0.2}\n")
    stop = clean_releases("/srv/userrel", state="/srv/userstate", boot=False)
    try:
        r = cli(capsys, inv, "-l", "lab3", "deploy", str(spec), "--json")
        assert r.rc == 0, r.err
        pid = nonroot_lab.ssh("lab3", "head -1 /srv/userstate/service/sglang.pid").stdout.strip()
        status = nonroot_lab.ssh("lab3", f"grep -E '^(Uid|Gid):' /proc/{pid}/status").stdout.split()
        assert status[1:5] == ["2400"] * 4 and status[6:10] == ["2400"] * 4, status
        env = nonroot_lab.ssh("lab3", "stat -c '%U %G %a' /srv/userrel/current/service.env").stdout.strip()
        assert env == "root fleetop 640"
        readable = nonroot_lab.ssh("lab3", "cat /srv/userrel/current/service.env", user="fleetop").stdout
        assert "SECRET_THING" in readable
        info = nonroot_lab.ssh("lab3", "/usr/bin/python3 -c \"import urllib.request as u; print(u.urlopen("
                                       f"'http://{nonroot_lab.addresses['lab3']}:30078/health', "
                                       "timeout=5).status)\"").stdout.strip()
        assert info == "200"
        assert "\nUser=fleetop\n" in unit(load_spec(spec), HostLayout())  # the systemd form of the same
    finally:
        nonroot_lab.ssh("lab3", stop)


def test_kept_drift_as_fleetop_answers_as_fresh_and_sees_a_version_changed_between_commands(
        nonroot_lab: LabHandle, tmp_path: Path, mux_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Production's shape, no become: fleetop's dist cache is its own private file, which its kept
    agent remembers between commands; the kept answers are the fresh one, and a distribution's
    version changed between two kept commands is seen by the next."""
    from fleetctl.transport import mux

    inv = user_inventory(nonroot_lab, tmp_path / "inv.yml")
    meta = f"{ENV}/lib/python3.11/site-packages/nonrootpkg-1.0.dist-info/METADATA"

    def audit(*persist: str) -> dict:  # type: ignore[type-arg]
        r = cli(capsys, inv, *persist, "-l", "lab1,lab2", "drift", "--venv", ENV, "--json")
        assert r.rc == 1, r.out + r.err  # lab2 lacks nonrootpkg: a drift, not a failure
        return {row["name"]: [c["text"] for c in row["cells"]] for row in r.json()["matrix"]["rows"]}

    fresh = audit()
    assert fresh == {"nonrootpkg": ["1.0", "1.0", "-"]}  # baseline (lab1), lab1, lab2
    assert [audit("--persist", "60") for _ in range(2)] == [fresh, fresh]
    listed = mux.server_status(mux.socket_path(mux_dir)) or []
    assert sorted(c["address"].split("@")[0] for c in listed) == ["fleetop", "fleetop"]  # the kept path
    cached = nonroot_lab.ssh("lab1", "ls /home/fleetop/.cache/fleetctl/cache", user="fleetop").stdout.split()
    assert [n for n in cached if n.startswith("dists-")], cached  # fleetop's own dist cache
    nonroot_lab.ssh("lab1", f"sed -i 's/^Version: 1.0$/Version: 1.1/' {meta}")
    try:
        changed = audit("--persist", "60")
    finally:
        nonroot_lab.ssh("lab1", f"sed -i 's/^Version: 1.1$/Version: 1.0/' {meta}")
    assert changed == {"nonrootpkg": ["1.1", "1.1", "-"]}
