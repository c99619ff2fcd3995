"""``async``/``poll`` and ``async_status`` over real sshd (the session lab): a waited job returns the
command's result, a job past its time limit is killed and fails with Ansible's message, and a job
started with ``poll: 0`` outlives the SSH connection that started it: a later run, over a new
connection, reads it finished with ``async_status`` + ``until``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli
from lab_support import LabHandle

pytestmark = pytest.mark.lab
ASYNC_DIR = "/var/lib/fleetctl/async"
GATE = "/root/async-test-gate"


@pytest.fixture
def lab(lab_fleet: LabHandle) -> Iterator[LabHandle]:
    lab_fleet.ssh("lab1", f"rm -rf {ASYNC_DIR} {GATE}")
    yield lab_fleet
    lab_fleet.ssh("lab1", f"rm -rf {ASYNC_DIR} {GATE}")  # the session lab stays pristine


def play(lab: LabHandle, capsys: pytest.CaptureFixture[str], tmp_path: Path, tasks: list[dict[str, Any]],
         *extra: str) -> CliRun:
    book = tmp_path / "async.yml"
    book.write_text(yaml.safe_dump([{"name": "p", "hosts": "lab1", "tasks": tasks}], sort_keys=False))
    return run_cli(capsys, "-i", str(lab.inventory_path), "run", str(book), "--json", *extra)


def test_waited_job_and_job_past_its_limit(lab: LabHandle, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    r = play(lab, capsys, tmp_path, [
        {"name": "waited", "shell": "sleep 3; echo done", "async": 20, "poll": 1, "register": "w"},
        {"name": "seen", "assert": {"that": ["w.stdout == 'done'", "w.rc == 0"]}},
        {"name": "too long", "shell": "sleep 3918; touch /root/async-never", "async": 2, "poll": 1},
    ])
    assert r.rc == 2, r.out[-3000:] + r.err
    got = {x["name"]: x for x in r.json()["results"]["lab1"]}
    assert got["waited"]["status"] == "changed" and got["waited"]["data"]["stdout"] == "done"
    assert got["seen"]["status"] == "ok"
    assert got["too long"]["status"] == "failed"
    assert got["too long"]["msg"] == "async task did not complete within the requested time - 2s"
    left = lab.ssh("lab1", "pgrep -f 'sleep 3918' || true; ls /root/async-never 2>&1 || true").stdout
    assert "3918" not in left and "No such file" in left  # killed, its process group with it


def test_poll_zero_job_outlives_the_connection(lab: LabHandle, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    job = f"while [ ! -e {GATE} ]; do sleep 0.2; done; echo survived"
    r = play(lab, capsys, tmp_path, [{"name": "start", "shell": job, "async": 600, "poll": 0, "register": "j"}])
    assert r.rc == 0, r.out[-3000:] + r.err
    jid = r.json()["results"]["lab1"][0]["data"]["ansible_job_id"]
    # fleetctl has exited: its SSH connection and agent are gone; the job still runs on the host.
    record = json.loads(lab.ssh("lab1", f"cat {ASYNC_DIR}/{jid}.json").stdout)
    assert record["started"] == 1 and record["finished"] == 0
    assert lab.ssh("lab1", f"stat -c %a {ASYNC_DIR}/{jid}.json").stdout.strip() == "600"
    lab.ssh("lab1", f"touch {GATE}")  # only now can the job end: long after its connection closed
    r = play(lab, capsys, tmp_path, [
        {"name": "wait", "async_status": {"jid": "{{ jid }}"}, "register": "s", "until": "s.finished",
         "retries": 300, "delay": 0.5},
        {"name": "seen", "assert": {"that": ["s.stdout == 'survived'", "s.rc == 0"]}},
        {"name": "cleanup", "async_status": {"jid": "{{ jid }}", "mode": "cleanup"}},
    ], "-e", f"jid={jid}")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert lab.ssh("lab1", f"ls {ASYNC_DIR}").stdout.strip() == ""
