"""Playbook rollouts end to end on a 4-host lab (real sshd hosts, the real sglang 0.5.23 wheel):
canary-first batches, failure budgets, rollback_all / rollback_failed, an unreachable host,
check mode, Ctrl-C, --resume, the journal, and secrets kept out of everything it writes.

Every host starts each test on the plain release (the "previous" one); the DDTree release is
what the rollouts deploy. A host's state is judged by its `current` release id and what the
service answers, as a user would check it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli
from lab_support import (
    _NET,
    REPO,
    LabHandle,
    lab_usable,
    private_lab,
    process_gone,
    unhealthy_release_spec,
    worker_lab_dir,
)
from reliability_support import assert_whole, fault_happened, release_state, wait_until
from sglang_support import NEW_SGLANG, wheel
from sglang_support import make_venv as make_sglang_venv

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
RELEASES = REPO / "playbooks" / "releases"
PLAIN = RELEASES / "sglang-0.5.23-lab.yml"
DDTREE = RELEASES / "ddtree-sglang-0.5.23-lab.yml"
ROLLOUT_LAB_DIR = worker_lab_dir("test-lab-rollout")
ROLLOUT_LAB_BASE = f"127.{_NET}.79.0"
HOSTS = ["lab1", "lab2", "lab3", "lab4"]


@pytest.fixture(scope="module")
def rollout_lab() -> Iterator[LabHandle]:
    """4 hosts with sglang 0.5.23 at /root/ml-env, each running the plain release."""
    why = lab_usable()
    if why:
        pytest.skip(why)
    with private_lab(ROLLOUT_LAB_DIR, 4, ROLLOUT_LAB_BASE) as lab:
        from concurrent.futures import ThreadPoolExecutor

        whl = wheel("sglang", NEW_SGLANG)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda h: make_sglang_venv(lab, h, "/root/ml-env", [whl]), HOSTS))
        r = subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "-i", str(lab.inventory_path), "-l", "all",
                            "deploy",
                            str(PLAIN)], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        yield lab


@pytest.fixture
def lab(rollout_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> Iterator[LabHandle]:
    """Each test starts with every host on the plain release, its service healthy."""
    yield rollout_lab
    rollout_lab.restore()
    r = run_cli(capsys, "-i", str(rollout_lab.inventory_path), "-l", "all", "rollback", "--to", plain_id(),
                "--timeout", "30")
    assert r.rc == 0, r.out + r.err


def plain_id() -> str:
    return load_spec(PLAIN).release_id


def ddtree_id() -> str:
    return load_spec(DDTREE).release_id


def current(lab: LabHandle, host: str) -> str:
    return lab.ssh(host, "basename $(readlink /opt/fleetctl/current)").stdout.strip()


def currents(lab: LabHandle) -> dict[str, str]:
    return {h: current(lab, h) for h in HOSTS}


def serving(lab: LabHandle, host: str) -> str:
    """The release the running service answers from (its /server_info)."""
    out = lab.ssh(host, f"/usr/bin/python3 -c \"import urllib.request as u; print(u.urlopen("
                        f"'http://{lab.addresses[host]}:30000/server_info', timeout=5).read().decode())\"")
    return str(json.loads(out.stdout)["fleetctl_standin"]["release"])


def playbook(tmp_path: Path, plays: list[dict[str, Any]], name: str = "rollout.yml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return path


def rollout(serial: Any, extra_tasks: list[dict[str, Any]] | None = None, spec: Path = DDTREE,
            **play: Any) -> list[dict[str, Any]]:
    return [{"name": "rollout", "hosts": "lab", "serial": serial, **play,
             "tasks": [{"name": "deploy", "release": str(spec)}, *(extra_tasks or [])]}]


def run(capsys: pytest.CaptureFixture[str], lab: LabHandle, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(lab.inventory_path), "run", *args)


def journal_events(lab: LabHandle, run_id: str) -> list[dict[str, Any]]:
    path = lab.inventory_path.parent / ".fleetctl" / "runs" / f"{run_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_repo_playbooks_provision_roll_out_audit_and_roll_back(lab: LabHandle, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The playbooks in playbooks/ as a user runs them against a lab: provision (check mode),
    deploy-ddtree (canary 1 host, then 50%, then the rest), audit (read-only), rollback."""
    lock = tmp_path / "sglang.lock"
    lock.write_text(f"sglang=={NEW_SGLANG}\n")
    target = ("-e", "target=lab", "-e", "venv=/root/ml-env")
    prov = run(capsys, lab, str(REPO / "playbooks" / "provision.yml"), *target, "-e", f"base_lock={lock}",
               "--check", "--json")
    assert prov.rc == 0, prov.out + prov.err
    assert {r["status"] for h in HOSTS for r in prov.json()["results"][h]} <= {"ok", "skipped"}

    r = run(capsys, lab, str(REPO / "playbooks" / "deploy-ddtree.yml"), *target,
            "-e", "release_spec=releases/ddtree-sglang-0.5.23-lab.yml", "--json")
    doc = r.json()
    assert r.rc == 0 and doc["status"] == "ok", r.err
    assert currents(lab) == dict.fromkeys(HOSTS, ddtree_id())
    assert {serving(lab, h) for h in HOSTS} == {ddtree_id()}
    events = journal_events(lab, doc["run_id"])
    # play 1 stages on every host at once; play 2 switches them canary first
    assert [(e["play"], e["hosts"]) for e in events if e["event"] == "batch_start"] == [
        (0, HOSTS), (1, ["lab1"]), (1, ["lab2", "lab3"]), (1, ["lab4"])]
    staged = {e["host"]: e for e in events if e["event"] == "task_result" and e["name"].startswith("stage")}
    assert set(staged) == set(HOSTS) and all(e["msg"].startswith(f"staged {ddtree_id()}") for e in staged.values())
    batch1 = next(e for e in events if e["event"] == "batch_start" and e["play"] == 1)
    assert max(e["ts"] for e in staged.values()) <= batch1["ts"]  # every build finished before batch 1
    deployed = [e for e in events if e["event"] == "task_result" and e["name"].startswith("deploy")]
    assert len(deployed) == 4 and all("from its staged build" in e["msg"] for e in deployed)
    assert [e["releases"] for e in events if e["event"] == "recorded"][-1] == dict.fromkeys(HOSTS, plain_id())
    assert all(doc["recap"][h]["changed"] == 2 and doc["recap"][h]["failed"] == 0 for h in HOSTS)
    # in the rollout play, the canary finished every task before any other host started
    first_other = next(i for i, e in enumerate(events) if e.get("host") in ("lab2", "lab3", "lab4")
                       and e.get("play") == 1)
    canary_done = next(i for i, e in enumerate(events) if e["event"] == "host_done" and e["host"] == "lab1"
                       and e["play"] == 1)
    assert canary_done < first_other
    # the journal reads back
    listed = run_cli(capsys, "-i", str(lab.inventory_path), "runs", "list", "--json").json()
    assert {"run_id": doc["run_id"], "status": "ok"}.items() <= next(
        s for s in listed if s["run_id"] == doc["run_id"]).items()
    shown = run_cli(capsys, "-i", str(lab.inventory_path), "runs", "show", doc["run_id"])
    assert shown.rc == 0 and "BATCH 3/3" in shown.out and "lab4" in shown.out

    audit = run(capsys, lab, str(REPO / "playbooks" / "audit.yml"), *target, "-e", "golden_host=lab1", "--json")
    assert audit.rc == 0, audit.out + audit.err
    assert all(c["changed"] == 0 and c["failed"] == 0 for c in audit.json()["recap"].values())

    back = run(capsys, lab, str(REPO / "playbooks" / "rollback.yml"), *target, "--json")
    assert back.rc == 0, back.out + back.err
    assert currents(lab) == dict.fromkeys(HOSTS, plain_id())
    assert {serving(lab, h) for h in HOSTS} == {plain_id()}


def test_canary_failing_its_health_gate_stops_the_rollout(lab: LabHandle, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    sick = unhealthy_release_spec(tmp_path)
    book = playbook(tmp_path, rollout([1, "100%"], spec=sick, on_failure="rollback_all"))
    r = run(capsys, lab, str(book))
    assert r.rc == 2
    assert "HALTED after batch 1" in r.out and "not started: lab2, lab3, lab4" in r.out
    assert currents(lab) == dict.fromkeys(HOSTS, plain_id())  # the canary went back on its own
    assert serving(lab, "lab1") == plain_id()
    for host in ("lab2", "lab3", "lab4"):  # never touched: the sick release was not even built there
        assert not [r for r in lab.ssh(host, "ls /opt/fleetctl/releases").stdout.split() if r.startswith("sick")]


def test_failure_in_batch_two_rolls_every_switched_host_back(lab: LabHandle, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    book = playbook(tmp_path, rollout([1, 2, 1], [{"name": "smoke test", "fail": "lab3 smoke test failed",
                                                   "when": "inventory_hostname == 'lab3'"}],
                                      max_fail_percentage=0, on_failure="rollback_all"))
    r = run(capsys, lab, str(book), "--json")
    doc = r.json()
    assert r.rc == 2 and doc["status"] == "halted"
    assert currents(lab) == dict.fromkeys(HOSTS, plain_id())
    assert {serving(lab, h) for h in HOSTS} == {plain_id()}
    events = journal_events(lab, doc["run_id"])
    rolled = {e["host"]: e["status"] for e in events if e["event"] == "rollback"}
    assert rolled == {"lab1": "rolled-back", "lab2": "rolled-back", "lab3": "rolled-back"}  # lab4: never switched
    assert doc["recap"]["lab4"] == {k: 0 for k in doc["recap"]["lab4"]}
    assert doc["recap"]["lab3"]["failed"] == 1 and doc["recap"]["lab3"]["rolled_back"] == 1


def test_max_failures_then_resume_completes_the_run(lab: LabHandle, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # The smoke test fails where /root/smoke-broken exists (each host's own /root); a resume runs with the
    # run's own -e, so the fix is on the hosts, as an operator's would be.
    plays = rollout(1, [{"name": "smoke test", "shell": "test ! -e /root/smoke-broken"}], max_failures=1,
                    on_failure="rollback_failed")
    book = playbook(tmp_path, plays)
    for host in ("lab2", "lab3"):
        lab.ssh(host, "touch /root/smoke-broken")
    r = run(capsys, lab, str(book), "--json")
    doc = r.json()
    assert r.rc == 2 and doc["status"] == "halted"
    # lab2 failed (1, within the budget), lab3 failed (2 > 1): stop; lab4 never started
    assert currents(lab) == {"lab1": ddtree_id(), "lab2": plain_id(), "lab3": plain_id(), "lab4": plain_id()}
    halted = [e for e in journal_events(lab, doc["run_id"]) if e["event"] == "halted"]
    assert halted[0]["why"] == "max_failures 1 exceeded: 2 host(s) failed in this rollout"
    assert halted[0]["not_started"] == ["lab4"]
    # fixed: resume skips lab1 (finished) and takes the others through
    for host in ("lab2", "lab3"):
        lab.ssh(host, "rm -f /root/smoke-broken")
    again = run(capsys, lab, str(book), "--resume", doc["run_id"], "--json")
    assert again.rc == 0, again.err
    assert currents(lab) == dict.fromkeys(HOSTS, ddtree_id())
    events = journal_events(lab, doc["run_id"])
    resumed_batches = [e["hosts"] for e in events[events.index(next(e for e in events if e["event"] == "resume")):]
                       if e["event"] == "batch_start"]
    assert resumed_batches == [["lab2"], ["lab3"], ["lab4"]]
    assert run_cli(capsys, "-i", str(lab.inventory_path), "runs", "list", "--json").json()[-1]["status"] == "ok"


def test_unreachable_host_mid_rollout(lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    book = playbook(tmp_path, rollout([1, 3], max_failures=0, on_failure="rollback_all",
                                      pause_between_batches=4))
    proc = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", str(lab.inventory_path), "run",
                             str(book), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = wait_for_event(lab, proc, "batch_end")
    sshd = lab.pids()["lab3"]
    lab.stop("lab3")  # its sshd and every session in it: the host is gone mid-rollout
    fault_happened(process_gone(sshd), f"lab3's sshd (pid {sshd}) killed")
    out, err = proc.communicate(timeout=300)
    doc = json.loads(out)
    assert proc.returncode == 2 and doc["status"] == "halted", err
    assert doc["recap"]["lab3"]["unreachable"] == 1
    events = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [e["why"] for e in events if e["event"] == "halted"] == [
        "max_failures 0 exceeded: 1 host(s) failed in this rollout"]
    lab.restore("lab3")
    # the hosts that switched went back; lab3, back up, is on a complete release (it never switched;
    # its server died with its sshd, and the supervisor's boot entry brought it back)
    assert currents(lab) == dict.fromkeys(HOSTS, plain_id())
    wait_until(lambda: release_state(lab, "lab3")["service_pid"], "lab3's server back after the restart")
    for host in HOSTS:
        assert_whole(lab, host, plain_id())
    # and going on with the run finishes the job everywhere
    again = run(capsys, lab, str(book), "--resume", journal.stem)
    assert again.rc == 0, again.out + again.err
    assert currents(lab) == dict.fromkeys(HOSTS, ddtree_id())
    assert serving(lab, "lab3") == ddtree_id()
    for host in HOSTS:
        assert_whole(lab, host, ddtree_id())


def wait_for_event(lab: LabHandle, proc: subprocess.Popen[str], kind: str, timeout: float = 240) -> Path:
    folder = lab.inventory_path.parent / ".fleetctl" / "runs"
    before = set(folder.glob("*.jsonl")) if folder.is_dir() else set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for path in set(folder.glob("*.jsonl")) - before if folder.is_dir() else ():
            if any(json.loads(line).get("event") == kind for line in path.read_text().splitlines()
                   if line.endswith("}")):
                return path
        time.sleep(0.1)
    raise AssertionError(f"no {kind} event within {timeout}s")


def test_ctrl_c_stops_between_batches_and_resume_finishes(lab: LabHandle, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    book = playbook(tmp_path, rollout([1, "100%"], pause_between_batches=5, on_failure="rollback_all"))
    proc = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", str(lab.inventory_path), "run",
                             str(book)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = wait_for_event(lab, proc, "batch_end")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "INTERRUPTED" in out
    events = [json.loads(x) for x in journal.read_text().splitlines()]
    stop = next(e for e in events if e["event"] == "interrupted")
    assert stop["pending"] == ["lab2", "lab3", "lab4"]
    # no host between releases: the canary on the new one, the rest untouched
    assert currents(lab) == {"lab1": ddtree_id(), "lab2": plain_id(), "lab3": plain_id(), "lab4": plain_id()}
    for host in HOSTS:  # each whole, state.json agreeing, lock free, serving what `current` names
        assert_whole(lab, host, ddtree_id() if host == "lab1" else plain_id())
    again = run(capsys, lab, str(book), "--resume", journal.stem)
    assert again.rc == 0, again.out + again.err
    assert currents(lab) == dict.fromkeys(HOSTS, ddtree_id())
    for host in HOSTS:
        assert_whole(lab, host, ddtree_id())


def fingerprint(lab: LabHandle, host: str) -> str:
    """Every file and link under the release root, the state folder and the base venv with its
    size, mtime and target (any write changes one), and every folder by name (a folder's mtime
    moves when the run's lock bookkeeping comes and goes); the lock files, the agent's
    compiled-code cache and bytecode are left out."""
    skip = ("-not -path '*/__pycache__*' -not -name 'deploy.lock*' -not -path 'var/lib/fleetctl/cache*'")
    cmd = (f"cd / && {{ find opt var/lib/fleetctl root/ml-env {skip} -type d -printf '%p/\\n'; "
           f"find opt var/lib/fleetctl root/ml-env {skip} -not -type d -printf '%p %y %s %T@ %l\\n'; }}"
           " | sort | sha256sum")
    return lab.ssh(host, cmd).stdout.split()[0]


def test_check_mode_changes_nothing(lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {h: fingerprint(lab, h) for h in HOSTS}
    book = playbook(tmp_path, rollout([1, "100%"], [{"service": "restarted"},
                                                    {"shell": "touch /opt/fleetctl/should-not-exist"}],
                                      on_failure="rollback_all"))
    r = run(capsys, lab, str(book), "--check", "--diff")
    assert r.rc == 0, r.out + r.err
    assert "would deploy" in r.out and "+++ b/sglang/srt/speculative/spec_info.py" in r.out
    # piped (not a terminal), the rendered command is one whole line, its last launch args included
    commands = [line for line in r.out.splitlines() if line.startswith("/opt/fleetctl/current/venv/bin/python ")]
    assert commands and all(line.endswith(" --speculative-num-draft-tokens 16 --enable-metrics")
                            for line in commands), commands
    assert {h: fingerprint(lab, h) for h in HOSTS} == before


def test_secrets_never_reach_output_or_journal(lab: LabHandle, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    token = "hf_sEcReT0123456789"
    inventory = yaml.safe_load(lab.inventory_path.read_text())
    inventory["all"].setdefault("vars", {}).update(secret_vars=["HF_TOKEN"], HF_TOKEN=token)
    inv = lab.inventory_path.parent / "with-secret.yml"
    inv.write_text(yaml.safe_dump(inventory))
    book = playbook(tmp_path, [{"hosts": "lab1", "tasks": [
        {"name": "use the token", "shell": "echo token={{ HF_TOKEN }}", "register": "out"},
        {"name": "show it", "fail": "got {{ out.stdout }}", "ignore_errors": True}]}])
    try:
        r = run_cli(capsys, "-i", str(inv), "run", str(book), "--json")
        assert r.rc == 0, r.err
        assert token not in r.out + r.err and "token=********" in r.out
        journal = inv.parent / ".fleetctl" / "runs" / f"{r.json()['run_id']}.jsonl"
        assert token not in journal.read_text() and "token=********" in journal.read_text()
        assert oct(journal.stat().st_mode & 0o777) == "0o600"
        plain = run_cli(capsys, "-i", str(inv), "run", str(book))
        assert token not in plain.out + plain.err and "got token=********" in plain.out
    finally:
        inv.unlink()


def test_red_gpu_host_is_left_out_of_the_rollout(lab: LabHandle, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """deploy-ddtree.yml's own tasks, every host with a fake nvidia-smi (host var nvidia_smi): lab2 prints
    the real H200 capture with row remapping pending. Its gpu_health task fails before the release task,
    so nothing is built or switched there; it counts against the budget and the recap names it. With the
    repo's budget (0%) that halts the rollout; with max_failures: 1 the other hosts deploy."""
    from gpu_fixtures import FAKE_SMI, H200_XML, derive, install_fake_smi, remove_fake_smi

    # earlier tests leave the DDTree release's folder on lab2 (kept for rollback): start without it
    lab.ssh("lab2", f"rm -rf /opt/fleetctl/releases/{ddtree_id()}")
    for host in HOSTS:
        install_fake_smi(lab, host, derive("remap-pending") if host == "lab2" else H200_XML, tmp_path)
    try:
        smi = ("-e", "target=lab", "-e", f"nvidia_smi={FAKE_SMI}", "-e", f"release_spec={DDTREE}")
        repo = run(capsys, lab, str(REPO / "playbooks" / "deploy-ddtree.yml"), *smi, "-l", "lab2,lab3", "--json")
        doc = repo.json()
        assert repo.rc == 2 and doc["status"] == "halted", repo.out + repo.err
        assert doc["recap"]["lab2"]["failed"] == 1
        assert doc["results"]["lab2"][0]["msg"].startswith("GPU health red: GPU 0 row_remapping (pending: yes")
        assert [r["name"] for r in doc["results"]["lab2"]] == ["GPU health (a red host is left out, before "
                                                               "anything is deployed to it)"]
        assert currents(lab) == dict.fromkeys(HOSTS, plain_id())  # the canary was red: nothing deployed

        plays = yaml.safe_load((REPO / "playbooks" / "deploy-ddtree.yml").read_text())
        del plays[0]["max_fail_percentage"]  # the staging play: one red host may fail it
        plays[0]["max_failures"] = 1
        book = playbook(tmp_path, plays, "deploy-budget-1.yml")
        r = run(capsys, lab, str(book), *smi, "--json")
        doc = r.json()
        assert r.rc == 2 and doc["status"] == "failed", r.out + r.err  # a host failed: exit 2, not halted
        assert currents(lab) == {"lab1": ddtree_id(), "lab2": plain_id(), "lab3": ddtree_id(), "lab4": ddtree_id()}
        assert serving(lab, "lab2") == plain_id()
        assert not [d for d in lab.ssh("lab2", "ls /opt/fleetctl/releases").stdout.split() if d == ddtree_id()]
        assert doc["recap"]["lab2"]["failed"] == 1 and doc["recap"]["lab2"]["changed"] == 0
        # changed: the switch, and the staging unless an earlier test staged the release there already
        assert all(doc["recap"][h]["failed"] == 0 and doc["recap"][h]["changed"] >= 1 for h in ("lab1", "lab3",
                                                                                                 "lab4"))
        events = journal_events(lab, doc["run_id"])
        # lab2 failed the staging play, so the rollout play leaves it out
        assert [e["failed"] for e in events if e["event"] == "batch_end"] == [["lab2"], [], [], []]
        assert next(e for e in events if e["event"] == "play_start" and e["play"] == 1)["left_out"] == ["lab2"]
    finally:
        for host in HOSTS:
            remove_fake_smi(lab, host)
