"""Ansible's ``async``/``poll`` task keywords and ``async_status`` on a local-connection host (real
commands, no SSH): a waited job's result is the command's, a job past its time limit is killed and
fails with Ansible's message, ``poll: 0`` leaves a job that ``async_status`` + ``until`` reads,
check mode starts nothing. The same over real sshd: tests/test_e2e_playbook_async.py."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli

INVENTORY = """\
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: /usr/bin/python3
    fleetctl_state_dir: {state}
  hosts:
    one: {{}}
"""


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY.format(state=tmp_path / "state"))
    return path


def run(capsys: pytest.CaptureFixture[str], inv: Path, tmp_path: Path, tasks: list[dict[str, Any]],
        *args: str) -> CliRun:
    book = tmp_path / "book.yml"
    book.write_text(yaml.safe_dump([{"name": "p", "hosts": "one", "tasks": tasks}], sort_keys=False))
    return run_cli(capsys, "-i", str(inv), "run", str(book), "--json", *args)


def results(r: CliRun) -> dict[str, dict[str, Any]]:
    return {x["name"]: x for x in r.json()["results"]["one"]}


def jobs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "state" / "async").glob("*.json")) if (tmp_path / "state" / "async").is_dir() else []


def test_waited_job_returns_the_commands_result(inv: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    r = run(capsys, inv, tmp_path, [
        {"name": "shell", "shell": "sleep 3; echo done", "async": 20, "poll": 1, "register": "s"},
        {"name": "command", "command": "sh -c 'echo out; echo err >&2; exit 3'", "async": 20, "poll": 1,
         "register": "c", "ignore_errors": True},
        {"name": "seen", "assert": {"that": ["s.stdout == 'done'", "s.rc == 0", "s is changed",
                                             "c.rc == 3", "c.stdout == 'out'", "c.stderr == 'err'", "c is failed"]}},
    ])
    assert r.rc == 0, r.out[-3000:] + r.err
    got = results(r)
    assert got["shell"]["status"] == "changed" and got["shell"]["data"]["stdout"] == "done"
    assert got["command"]["status"] == "ignored" and got["command"]["msg"] == "exit 3: err"
    assert jobs(tmp_path) == []  # a job the task waited for leaves no file, as Ansible


def test_job_past_its_time_limit_is_killed_and_fails(inv: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "never"
    r = run(capsys, inv, tmp_path, [
        {"name": "long", "shell": f"sleep 3917; touch {marker}", "async": 2, "poll": 1}])
    assert r.rc == 2, r.out[-3000:] + r.err
    assert results(r)["long"]["msg"] == "async task did not complete within the requested time - 2s"
    left = subprocess.run(["pgrep", "-f", "sleep 3917; touch " + str(marker)], capture_output=True, text=True)
    assert left.stdout == ""  # the job's process group is gone, not left running
    assert not marker.exists()


def test_fire_and_forget_then_async_status_until_finished(inv: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    gate = tmp_path / "gate"
    r = run(capsys, inv, tmp_path, [
        {"name": "start", "shell": f"while [ ! -e {gate} ]; do sleep 0.1; done; echo later", "async": 600,
         "poll": 0, "register": "job"},
        {"name": "running", "async_status": {"jid": "{{ job.ansible_job_id }}"}, "register": "early"},
        {"name": "open the gate", "file": {"path": str(gate), "state": "touch"}},
        {"name": "wait", "async_status": {"jid": "{{ job.ansible_job_id }}"}, "register": "done",
         "until": "done.finished", "retries": 300, "delay": 0.2},
        {"name": "seen", "assert": {"that": ["job.started == 1", "job.finished == 0", "early.finished == 0",
                                             "done.finished == 1", "done.stdout == 'later'", "done.rc == 0"]}},
    ])
    assert r.rc == 0, r.out[-3000:] + r.err
    [job] = jobs(tmp_path)  # poll 0: the file stays until async_status cleans it up
    assert stat.S_IMODE(job.stat().st_mode) == 0o600 and stat.S_IMODE(job.parent.stat().st_mode) == 0o700
    assert json.loads(job.read_text())["finished"] == 1
    jid = job.stem
    cleanup = {"name": "cleanup", "ansible.builtin.async_status": {"jid": jid, "mode": "cleanup"}}  # FQCN too
    r = run(capsys, inv, tmp_path, [cleanup])
    assert r.rc == 0, r.out[-3000:] + r.err
    assert jobs(tmp_path) == []
    r = run(capsys, inv, tmp_path, [{"name": "gone", "async_status": {"jid": jid}}])
    assert r.rc == 2
    assert results(r)["gone"]["msg"].startswith(f"could not find job {jid}")


def test_check_mode_starts_no_job(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = run(capsys, inv, tmp_path, [{"name": "s", "shell": "touch nothing", "async": 20, "poll": 0}], "--check")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert results(r)["s"]["status"] == "skipped"
    assert jobs(tmp_path) == []


@pytest.mark.parametrize(("task", "expected"), [
    ({"copy": {"content": "x", "dest": "/tmp/x"}, "async": 10},
     "async: runs command, get_url, shell tasks as host jobs, not copy"),
    ({"shell": "true", "poll": 5}, "poll: needs `async`"),
    ({"shell": "true", "async": 0}, "async: Input should be greater than 0"),
])
def test_async_that_cannot_work_is_refused_at_load(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  task: dict[str, Any], expected: str) -> None:
    r = run(capsys, inv, tmp_path, [task])
    assert r.rc == 3
    assert "book.yml:" in r.err and expected in r.err, r.err


def test_get_url_as_a_job(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "weights.bin"
    src.write_bytes(b"w" * 100_000)
    url, dest = f"file://{src}", tmp_path / "dest.bin"
    r = run(capsys, inv, tmp_path, [
        {"name": "waited", "get_url": {"url": url, "dest": str(dest), "mode": "0640"}, "async": 60, "poll": 1,
         "register": "g"},
        {"name": "again", "get_url": {"url": url, "dest": str(dest)}, "async": 60, "poll": 0, "register": "j"},
        {"name": "status", "async_status": {"jid": "{{ j.ansible_job_id }}"}, "register": "s",
         "until": "s.finished", "retries": 300, "delay": 0.2},
        {"name": "bad sum", "get_url": {"url": url, "dest": str(tmp_path / "other.bin"), "checksum": "sha256:00"},
         "async": 60, "poll": 1, "ignore_errors": True},
        {"name": "seen", "assert": {"that": ["g is changed", "g.size == 100000", "s is not changed"]}},
    ])
    assert r.rc == 0, r.out[-3000:] + r.err
    assert dest.read_bytes() == src.read_bytes() and stat.S_IMODE(dest.stat().st_mode) == 0o640
    got = results(r)
    assert got["bad sum"]["status"] == "ignored"
    assert got["bad sum"]["msg"].startswith(f"the checksum for {url} did not match 00"), got["bad sum"]["msg"]
    assert not (tmp_path / "other.bin").exists()
