"""Production's login on the lab: every mission path as the non-root user ``fleetop`` with
``--become`` (passwordless sudo on the lab hosts), and sudo's refusals, one line each.

The inventory is the lab's with ``ansible_user: fleetop`` on every host and nothing else
changed; privileges come from the CLI's ``-b`` only. What is checked is what the operator
would check: who the commands ran as, what each host holds afterwards, what the service answers.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cli_support import CliRun, run_cli
from lab_support import REPO, LabHandle, sudo_mode, user_inventory
from sglang_support import NEW_SGLANG, visible_wheel, wheel

from fleetctl.lab.accounts import LAB_PASSWORD
from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
RELEASES = REPO / "playbooks" / "releases"
PLAIN = RELEASES / "sglang-0.5.23-lab.yml"
DDTREE = RELEASES / "ddtree-sglang-0.5.23-lab.yml"
NEW = ["lab1", "lab3"]  # sglang 0.5.23 at /root/ml-env (lab2 has 0.5.9)
H200 = "E=256,N=256,device_name=NVIDIA_H200.json"
GOOD = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
              "num_stages": 3}}


@pytest.fixture(scope="module")
def fleetop_inventory(release_free_lab: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab's inventory, logging in as fleetop (nothing else changed)."""
    return user_inventory(release_free_lab, tmp_path_factory.mktemp("fleetop") / "inventory.yml")


def cli(capsys: pytest.CaptureFixture[str], inventory: Path, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(inventory), *args)


def current(lab: LabHandle, host: str) -> str:
    return lab.ssh(host, "basename $(readlink /opt/fleetctl/current) 2>/dev/null", check=False).stdout.strip()


def serving(lab: LabHandle, host: str) -> str:
    out = lab.ssh(host, f"/usr/bin/python3 -c \"import urllib.request as u; print(u.urlopen("
                        f"'http://{lab.addresses[host]}:30000/server_info', timeout=5).read().decode())\"")
    return str(json.loads(out.stdout)["fleetctl_standin"]["release"])


def test_commands_run_as_root_through_sudo_and_as_fleetop_without(
        release_free_lab: LabHandle, fleetop_inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = cli(capsys, fleetop_inventory, "-l", "all", "shell", "--json", "id -un")
    assert plain.rc == 0 and {h["value"]["stdout"].strip() for h in plain.json()["hosts"].values()} == {"fleetop"}
    became = cli(capsys, fleetop_inventory, "-b", "-l", "all", "shell", "--json", "id -un; echo $HOME")
    assert became.rc == 0, became.err
    assert {h["value"]["stdout"] for h in became.json()["hosts"].values()} == {"root\n/root\n"}  # sudo -H
    other = cli(capsys, fleetop_inventory, "-b", "--become-user", "nobody", "-l", "all", "shell", "--json",
                "id -un")
    assert {h["value"]["stdout"].strip() for h in other.json()["hosts"].values()} == {"nobody"}
    facts = cli(capsys, fleetop_inventory, "-b", "facts", "--json")
    assert facts.rc == 0 and set(facts.json()["hosts"]) == set(release_free_lab.hosts)


def test_read_only_paths_with_become(release_free_lab: LabHandle, fleetop_inventory: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Every probe kind and drift --verify-files twice (the second from the hash cache), as fleetop -b."""
    venv = ("--venv", "/root/ml-env")  # only root can read /root: these work through sudo alone
    grep = cli(capsys, fleetop_inventory, "-b", "-l", "lab1", "probe", "grep", "update_mamba_state_after_mtp_verify",
               "--package", "sglang", "--subpath", "srt", *venv, "--json")
    assert grep.rc == 0 and grep.json()["hosts"]["lab1"]["value"]["matched_lines"] > 0, grep.out + grep.err
    again = cli(capsys, fleetop_inventory, "-b", "-l", "lab1", "probe", "grep", "update_mamba_state_after_mtp_verify",
                "--package", "sglang", "--subpath", "srt", *venv, "--json").json()["hosts"]["lab1"]["value"]
    assert again["files"] == grep.json()["hosts"]["lab1"]["value"]["files"] and again["cache_note"] is None
    assert again["cached_files"] > 0  # root's grep cache under sudo, not fleetop's
    kept = release_free_lab.ssh("lab1", "stat -c '%U %a' /var/lib/fleetctl/cache/grep-*.marshal").stdout.split()
    assert kept[:2] == ["root", "600"], kept
    symbol = cli(capsys, fleetop_inventory, "-b", "-l", "lab1,lab2", "probe", "symbol", "SpeculativeAlgorithm.DFLASH",
                 *venv, "--json")
    hosts = symbol.json()["hosts"]
    assert len(hosts["lab1"]["value"]["definitions"]) == 1 and hosts["lab2"]["value"]["definitions"] == [], symbol.out
    imp = cli(capsys, fleetop_inventory, "-b", "-l", "lab1", "probe", "import", "sglang.version", *venv, "--json")
    assert imp.json()["hosts"]["lab1"]["value"]["dist_version"] == NEW_SGLANG, imp.out
    script = cli(capsys, fleetop_inventory, "-b", "-l", "lab1", "probe", "script",
                 str(REPO / "examples" / "probes" / "moe_configs.py"), *venv, "--json")
    assert script.rc == 0, script.out + script.err
    first = cli(capsys, fleetop_inventory, "-b", "-l", "lab1", "drift", "--verify-files", "--skip", "unsatisfied",
                *venv, "--json")
    assert first.rc == 0, first.out[-2000:] + first.err
    second = cli(capsys, fleetop_inventory, "-b", "-l", "lab1", "drift", "--verify-files", "--skip", "unsatisfied",
                 *venv, "--json")
    files = second.json()["hosts"]["lab1"]["files"]
    assert files["checked"] > 2000 and files["cache_misses"] == 0, files


def test_venvs_with_become(release_free_lab: LabHandle, fleetop_inventory: Path, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """venv create from a lock and a wheelhouse, then venv overlay from lab1, into root-owned paths."""
    lab = release_free_lab
    whl = Path(visible_wheel(lab, wheel("sglang", NEW_SGLANG)))
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / whl.name).symlink_to(whl)
    lock = tmp_path / "sglang.lock"
    lock.write_text(f"sglang=={NEW_SGLANG}\n")
    for host in ("lab1", "lab2"):
        lab.ssh(host, "rm -rf /opt/become-env /opt/become-ov")
    made = cli(capsys, fleetop_inventory, "-b", "-l", "lab1", "venv", "create", "--venv", "/opt/become-env",
               "--lock", str(lock), "--wheelhouse", str(tmp_path / "wheels"), "--json")
    assert made.rc == 0, made.out + made.err
    owner = lab.ssh("lab1", "stat -c %U /opt/become-env/bin/python3 && /opt/become-env/bin/python -c "
                            "'import importlib.metadata as m; print(m.version(\"sglang\"))'").stdout.split()
    assert owner == ["root", NEW_SGLANG]
    lab.ssh("lab2", "/usr/bin/python3 -m venv /opt/become-env")
    ov = cli(capsys, fleetop_inventory, "-b", "-l", "lab1,lab2", "venv", "overlay", "--from", "lab1",
             "--venv", "/opt/become-env", "--json")
    assert ov.rc == 0, ov.out + ov.err
    version = lab.ssh("lab2", "/opt/become-env/bin/python -c "
                              "'import importlib.metadata as m; print(m.version(\"sglang\"))'").stdout.strip()
    assert version == NEW_SGLANG
    for host in ("lab1", "lab2"):
        lab.ssh(host, "rm -rf /opt/become-env")


def test_deploy_status_rollback_and_kernels_with_become(release_free_lab: LabHandle, fleetop_inventory: Path,
                                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = release_free_lab
    limit = ("-l", ",".join(NEW))
    plain_id, ddtree_id = load_spec(PLAIN).release_id, load_spec(DDTREE).release_id
    assert cli(capsys, fleetop_inventory, "-b", *limit, "deploy", str(PLAIN)).rc == 0
    r = cli(capsys, fleetop_inventory, "-b", *limit, "deploy", str(DDTREE), "--json")
    assert r.rc == 0, r.out + r.err
    assert {h: current(lab, h) for h in NEW} == dict.fromkeys(NEW, ddtree_id)
    assert {serving(lab, h) for h in NEW} == {ddtree_id}
    status = cli(capsys, fleetop_inventory, "-b", *limit, "status", "--json")
    assert {v["value"]["current"] for v in status.json()["hosts"].values()} == {ddtree_id}, status.out
    listed = cli(capsys, fleetop_inventory, "-b", *limit, "releases", "list", "--json")
    assert listed.rc == 0, listed.err
    http = cli(capsys, fleetop_inventory, "-b", *limit, "probe", "http", "/health", "--expect-status", "200")
    assert http.rc == 0, http.out + http.err
    back = cli(capsys, fleetop_inventory, "-b", *limit, "rollback", "--json")
    assert back.rc == 0, back.out + back.err
    assert {h: current(lab, h) for h in NEW} == dict.fromkeys(NEW, plain_id)
    assert {serving(lab, h) for h in NEW} == {plain_id}
    # kernels collect from a root-only tuning folder on lab1
    lab.ssh("lab1", f"rm -rf /root/tune && mkdir -m 700 /root/tune && echo {shlex.quote(json.dumps(GOOD))} "
                    f"> /root/tune/{shlex.quote(H200)}")
    dest = tmp_path / "kernels"
    got = cli(capsys, fleetop_inventory, "-b", "-e", "triton_version=3.6.0", "kernels", "collect", "--from", "lab1",
              "--src", "/root/tune", "--dest", str(dest), "--json")
    assert got.rc == 0, got.out + got.err
    assert json.loads((dest / "triton_3_6_0" / H200).read_text()) == GOOD


def test_repo_playbooks_as_fleetop_with_become(release_free_lab: LabHandle, fleetop_inventory: Path,
                                               tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """provision (check mode), deploy-ddtree, audit and rollback, as a user runs them, as fleetop -b."""
    lab = release_free_lab
    limit = ("-l", ",".join(NEW))
    assert cli(capsys, fleetop_inventory, "-b", *limit, "deploy", str(PLAIN)).rc == 0
    lock = tmp_path / "sglang.lock"
    lock.write_text(f"sglang=={NEW_SGLANG}\n")
    target = ("-e", "target=lab", "-e", "venv=/root/ml-env")
    prov = cli(capsys, fleetop_inventory, "-b", *limit, "run", str(REPO / "playbooks" / "provision.yml"), *target,
               "-e", f"base_lock={lock}", "--check", "--json")
    assert prov.rc == 0, prov.out + prov.err
    roll = cli(capsys, fleetop_inventory, "-b", *limit, "run", str(REPO / "playbooks" / "deploy-ddtree.yml"), *target,
               "-e", "release_spec=releases/ddtree-sglang-0.5.23-lab.yml", "--json")
    assert roll.rc == 0 and roll.json()["status"] == "ok", roll.out[-3000:] + roll.err
    assert {serving(lab, h) for h in NEW} == {load_spec(DDTREE).release_id}
    audit = cli(capsys, fleetop_inventory, "-b", *limit, "run", str(REPO / "playbooks" / "audit.yml"), *target,
                "-e", "golden_host=lab1", "--json")
    assert audit.rc == 0, audit.out[-3000:] + audit.err
    back = cli(capsys, fleetop_inventory, "-b", *limit, "run", str(REPO / "playbooks" / "rollback.yml"), *target,
               "--json")
    assert back.rc == 0, back.out[-3000:] + back.err
    assert {serving(lab, h) for h in NEW} == {load_spec(PLAIN).release_id}


def _run(inventory: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "-i", str(inventory), *args], input=stdin,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize(("mode", "extra", "stdin", "line"), [
    ("password", (), "", "lab2: failed: sudo needs a password for fleetop: set ansible_become_password (a secret) "
                         "or pass -K/--ask-become-pass"),
    ("password", ("-K",), "not-the-password\n", "lab2: failed: sudo refused the become password for fleetop: "
                                                  "check ansible_become_password or the -K answer"),
    ("none", ("-K",), LAB_PASSWORD + "\n", "lab2: failed: fleetop may not use sudo (not in sudoers): "
                                           "ask for sudo rights or connect as another user"),
    ("requiretty", (), "", "lab2: failed: sudo requires a terminal for fleetop (Defaults requiretty): "
                           "add 'Defaults:fleetop !requiretty' to sudoers"),
])
def test_sudo_refusals_are_one_line_and_the_other_hosts_go_on(
        release_free_lab: LabHandle, fleetop_inventory: Path, mode: str, extra: tuple[str, ...], stdin: str,
        line: str) -> None:
    with sudo_mode(release_free_lab, "lab2", mode):
        r = _run(fleetop_inventory, "-b", *extra, "ping", stdin=stdin)  # no hang: _run's timeout
    assert r.returncode == 2, r.stdout + r.stderr
    assert [x for x in (r.stdout + r.stderr).splitlines() if x.startswith("lab2")] == [line], r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert "3 hosts: 2 ok, 1 failed, 0 unreachable" in r.stdout  # lab1 and lab3 went on


def test_the_right_become_password_works_from_the_inventory_and_from_k(
        release_free_lab: LabHandle, fleetop_inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with sudo_mode(release_free_lab, "lab2", "password"):
        r = cli(capsys, fleetop_inventory, "-b", "-e", f"ansible_become_password={LAB_PASSWORD}", "-l", "lab2",
                "ping", "--json")
        assert r.rc == 0, r.out + r.err
        assert LAB_PASSWORD not in r.out + r.err
        piped = _run(fleetop_inventory, "-b", "-K", "-l", "lab2", "shell", "id -un", stdin=LAB_PASSWORD + "\n")
        assert piped.returncode == 0 and "root" in piped.stdout, piped.stdout + piped.stderr
        assert LAB_PASSWORD not in piped.stdout + piped.stderr


def test_become_and_commands_work_past_descriptor_1023(
        release_free_lab: LabHandle, fleetop_inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A controller holding a thousand connections has descriptors past 1,023, where ``select``
    fails: sudo's password handshake and a command's output are waited on with ``poll``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1200
    if soft < want + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, want + 400), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(want)]  # every new descriptor is past 1,023
    try:
        held.append(os.open(os.devnull, os.O_RDONLY))
        assert held[-1] > 1023
        with sudo_mode(release_free_lab, "lab2", "password"):
            r = cli(capsys, fleetop_inventory, "-b", "-e", f"ansible_become_password={LAB_PASSWORD}", "-l", "lab2",
                    "shell", "--json", "id -un; echo done")
        assert r.rc == 0, r.out + r.err
        assert r.json()["hosts"]["lab2"]["value"]["stdout"] == "root\ndone\n"
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_play_and_task_become_keywords(release_free_lab: LabHandle, fleetop_inventory: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A play's `become` beats the CLI's (none here), a task's beats its play's (Ansible's rule)."""
    book = tmp_path / "who.yml"
    book.write_text(yaml.safe_dump([{"hosts": "lab1", "become": True, "tasks": [
        {"name": "play", "shell": {"cmd": "id -un"}},
        {"name": "task off", "shell": {"cmd": "id -un"}, "become": False},
        {"name": "task user", "shell": {"cmd": "id -un"}, "become_user": "nobody"},
    ]}]))
    r = cli(capsys, fleetop_inventory, "run", str(book), "--json")
    assert r.rc == 0, r.out + r.err
    got = {e["name"]: e["data"]["stdout"].strip() for e in r.json()["results"]["lab1"]}
    assert got == {"play": "root", "task off": "fleetop", "task user": "nobody"}


def test_a_command_past_its_timeout_under_sudo_is_ended_with_all_it_started(
        release_free_lab: LabHandle, fleetop_inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, fleetop_inventory, "-b", "-l", "lab1", "-T", "2", "shell", "sleep 771 & sleep 772; echo done")
    assert r.rc == 2 and "timed out" in r.out, r.out + r.err
    time.sleep(1.5)
    left = release_free_lab.ssh("lab1", "pgrep -f 'sleep 77[12]'", check=False)
    assert left.returncode == 1, left.stdout  # root's processes, ended through sudo too


def test_kept_connections_key_on_become(release_free_lab: LabHandle, fleetop_inventory: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent under sudo is never reused for a command without it (and the other way round)."""
    from fleetctl.transport import mux

    folder = tmp_path / "mux"
    monkeypatch.setenv("FLEETCTL_MUX_DIR", str(folder))
    try:
        who = {}
        for flags in ((), ("-b",)):
            r = cli(capsys, fleetop_inventory, "--persist", "60", *flags, "-l", "lab1", "ping", "--json")
            assert r.rc == 0, r.out + r.err
            who[flags] = r.json()["hosts"]["lab1"]["value"]["user"]
        assert who == {(): "fleetop", ("-b",): "root"}
        listed = run_cli(capsys, "--json", "connections", "list")
        addresses = sorted(k["address"] for k in listed.json()["connections"])
        address = release_free_lab.addresses["lab1"]
        assert addresses == [f"fleetop@{address}:22", f"fleetop@{address}:22 (sudo -u root)"], listed.out
    finally:
        mux.stop_server(mux.socket_path(folder))
