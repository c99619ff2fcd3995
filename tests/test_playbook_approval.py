"""The approval gate, `run --events` and timed `pause`, on local-connection hosts (no SSH): a rollout
waits at its gate until `fleetctl runs promote` or `runs abort` comes from a second process (the
real CLI in subprocesses), times out into on_timeout, and every answer is journaled with who gave it;
--events prints the journal's own lines on stdout as they happen, secrets masked; questions that
need a terminal are refused before anything runs when stdin is not one."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import pytest
import yaml
from cli_support import run_cli

INVENTORY = """\
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: /usr/bin/python3
    secret_vars: [token]
    token: s3cr3t-t0ken
  children:
    web:
      hosts:
        one: {}
        two: {}
        three: {}
"""


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    return path


def book(tmp_path: Path, plays: list[dict[str, Any]], name: str = "book.yml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return path


def gated(tmp_path: Path, **approval: Any) -> Path:
    marker = tmp_path / "ran"
    return book(tmp_path, [{"name": "gated", "hosts": "web", "serial": 1, "approval": approval, "tasks": [
        {"name": "work", "shell": f"echo {{{{ inventory_hostname }}}} >> {marker}"},
        {"name": "uses the secret", "shell": "echo {{ token }}"},
    ]}])


def fleetctl(inv: Path, *args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", str(inv), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def read_until(stream: IO[str], kind: str, seen: list[dict[str, Any]], timeout: float = 60) -> dict[str, Any]:
    """Read --events lines until an event of ``kind`` (every line must be one JSON object)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            raise AssertionError(f"the run ended before a {kind} event: {seen}")
        doc = json.loads(line)
        seen.append(doc)
        if doc["event"] == kind:
            return doc
    raise AssertionError(f"no {kind} event within {timeout}s")


def second_shell(inv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "-i", str(inv), *args],
                          capture_output=True, text=True, timeout=60)


def journal(inv: Path, run_id: str) -> list[str]:
    return (inv.parent / ".fleetctl" / "runs" / f"{run_id}.jsonl").read_text().splitlines()


def test_promote_from_a_second_process_opens_the_gate(inv: Path, tmp_path: Path) -> None:
    proc = fleetctl(inv, "run", str(gated(tmp_path, before_batch=2, timeout=120)), "--events")
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    wait = read_until(proc.stdout, "approval_wait", seen)
    run_id = seen[0]["run_id"]
    assert wait["batch"] == 2 and wait["promote"] == f"fleetctl runs promote {run_id}"
    assert [e["hosts"] for e in seen if e["event"] == "batch_start"] == [["one"]]  # batch 2 waits
    answer = second_shell(inv, "runs", "promote", run_id)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip().startswith(f"run {run_id}: promoted; batch 2 (")
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = [json.dumps(e) for e in seen] + rest.splitlines()
    events = [json.loads(line) for line in lines]
    decision = next(e for e in events if e["event"] == "approval")
    assert decision["decision"] == "promote" and "@" in decision["by"] and decision["batch"] == 2
    assert [e["batch"] for e in events if e["event"] == "batch_start"] == [1, 2, 3]
    # --events: the journal's own lines, in order, and no secret in them or in the human output
    on_disk = journal(inv, run_id)
    assert [json.loads(x) for x in on_disk] == events
    assert "s3cr3t-t0ken" not in rest + err and "s3cr3t-t0ken" not in "\n".join(on_disk)
    assert "WAITING for approval before batch 2/3" in err  # the human output went to stderr
    again = second_shell(inv, "runs", "promote", run_id)
    assert again.returncode == 3 and again.stderr.strip() == (
        f"fleetctl: error: run {run_id} has ended (ok): nothing to promote")


def test_abort_from_a_second_process_halts_before_the_batch(inv: Path, tmp_path: Path) -> None:
    proc = fleetctl(inv, "run", str(gated(tmp_path, before_batch=[2], timeout=120)), "--events")
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    read_until(proc.stdout, "approval_wait", seen)
    run_id = seen[0]["run_id"]
    answer = second_shell(inv, "runs", "abort", run_id)
    assert answer.returncode == 0, answer.stderr
    assert "aborted at the gate before batch 2" in answer.stdout
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    events = seen + [json.loads(x) for x in rest.splitlines()]
    halted = next(e for e in events if e["event"] == "halted")
    assert halted["why"].startswith("aborted at the approval gate before batch 2 by ")
    assert halted["not_started"] and [e["batch"] for e in events if e["event"] == "batch_start"] == [1]
    assert (tmp_path / "ran").read_text().split() == ["one"]  # no host of batch 2 or 3 was touched
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "halted"


def test_a_gate_nobody_answers_times_out_into_on_timeout(inv: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(inv), "run", str(gated(tmp_path, before_batch="each", timeout=1)), "--json")
    assert r.rc == 2 and r.json()["status"] == "halted", r.out + r.err
    events = [json.loads(x) for x in journal(inv, r.json()["run_id"])]
    assert next(e for e in events if e["event"] == "approval")["decision"] == "abort"
    assert next(e["why"] for e in events if e["event"] == "halted") == (
        "approval gate before batch 2: no promote within 1s (on_timeout: abort)")
    # on_timeout: promote opens each gate by itself (Argo's timed pause)
    r = run_cli(capsys, "-i", str(inv), "run", str(gated(tmp_path, before_batch="each", timeout=1,
                                                          on_timeout="promote")), "--json")
    assert r.rc == 0, r.out + r.err
    events = [json.loads(x) for x in journal(inv, r.json()["run_id"])]
    assert [(e["batch"], e["decision"]) for e in events if e["event"] == "approval"] == [
        (2, "promote"), (3, "promote")]
    assert next(e for e in events if e["event"] == "approval")["by"] == "timeout 1s (on_timeout: promote)"


def test_promote_and_abort_say_why_they_cannot(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(inv), "runs", "promote", "20990101-000000-nope")
    assert r.rc == 3 and r.err.startswith("fleetctl: error: no run 20990101-000000-nope in ")
    # a run that is not at a gate: promote refuses, abort stops it before its next batch
    go = tmp_path / "go"  # batch 1 runs until the test has asked
    slow = book(tmp_path, [{"hosts": "web", "serial": 1, "tasks": [
        {"name": "slow", "shell": f"while [ ! -e {go} ]; do sleep 0.1; done"}]}])
    proc = fleetctl(inv, "run", str(slow), "--events")
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    read_until(proc.stdout, "batch_start", seen)
    run_id = seen[0]["run_id"]
    no = second_shell(inv, "runs", "promote", run_id)
    assert no.returncode == 3 and no.stderr.strip() == (
        f"fleetctl: error: run {run_id} is not waiting at an approval gate (`runs promote` answers a gate; "
        "`runs abort` stops a run before its next batch)")
    stop = second_shell(inv, "runs", "abort", run_id)
    assert stop.returncode == 0 and "stops before its next batch" in stop.stdout
    go.touch()
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    events = seen + [json.loads(x) for x in rest.splitlines()]
    assert next(e["why"] for e in events if e["event"] == "halted").startswith("aborted before batch 2 by ")
    assert [e["batch"] for e in events if e["event"] == "batch_start"] == [1]


def test_bad_approval_keys_are_one_line(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = gated(tmp_path, before_batch=0)
    r = run_cli(capsys, "-i", str(inv), "run", str(path))
    assert r.rc == 3 and r.err.startswith(f"fleetctl: error: {path}:")
    assert "before_batch is a batch number (1 is the canary), a list of them, or 'each'" in r.err
    assert len(r.err.strip().splitlines()) == 1


def test_questions_need_a_terminal_and_timed_pauses_do_not(inv: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    prompt = book(tmp_path, [{"hosts": "web", "tasks": [
        {"name": "touch", "shell": f"touch {marker}"}, {"name": "ask", "pause": {"prompt": "go on?"}}]}])
    r = run_cli(capsys, "-i", str(inv), "run", str(prompt))  # pytest's stdin is not a terminal
    assert r.rc == 3 and r.err.strip() == (
        f"fleetctl: error: {prompt}:5: pause: a prompt waits for Enter on a terminal, and stdin is not a terminal "
        "(in CI give it seconds or minutes, or use the play's `approval` gate)")
    step = run_cli(capsys, "-i", str(inv), "run", str(prompt), "--step")
    assert step.rc == 3 and "--step asks before each batch on a terminal" in step.err
    assert not marker.exists()  # refused before anything ran
    both = run_cli(capsys, "-i", str(inv), "run", str(prompt), "--events", "--json")
    assert both.rc == 3 and "--events and --json both write to stdout" in both.err
    timed = book(tmp_path, [{"hosts": "web", "serial": 2, "tasks": [
        {"name": "soak", "pause": {"seconds": 0.5, "prompt": "soaking"}}, {"name": "after", "shell": "true"}]}],
        name="timed.yml")
    r = run_cli(capsys, "-i", str(inv), "run", str(timed), "--json")
    assert r.rc == 0, r.out + r.err
    events = [json.loads(x) for x in journal(inv, r.json()["run_id"])]
    pauses = [e for e in events if e["event"] == "task_start" and e["name"] == "soak"]
    assert [e["run_once"] for e in pauses] == [True, True]  # once per batch, not once per host
    result = next(e for e in events if e["event"] == "task_result" and e["name"] == "soak")
    assert result["msg"] == "paused 0.5s" and result["data"]["user_input"] == ""
    # a pause asked for is not a stuck rollout: it is not cut by progress_deadline, nor counted
    longer = book(tmp_path, [{"hosts": "web", "progress_deadline": 1, "tasks": [
        {"name": "soak", "pause": {"seconds": 1.5}}, {"name": "after", "shell": "true"}]}], name="longer.yml")
    r = run_cli(capsys, "-i", str(inv), "run", str(longer), "--json")
    assert r.rc == 0, r.out + r.err
    assert [x["status"] for x in r.json()["results"]["one"]] == ["ok", "changed"]
