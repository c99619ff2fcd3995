"""The playbook runner's task semantics on local-connection hosts (no SSH needed, real commands):
when, register, retries/until, ignore_errors, tags, --start-at-task, check mode, runtime template
errors naming file:line, resume skipping finished hosts, and the journal."""

from __future__ import annotations

import json
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
  children:
    web:
      hosts:
        one: {n: 1}
        two: {n: 2}
"""


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    return path


def book(tmp_path: Path, tasks: list[dict[str, Any]], **play: Any) -> Path:
    path = tmp_path / "book.yml"
    path.write_text(yaml.safe_dump([{"name": "p", "hosts": "web", **play, "tasks": tasks}], sort_keys=False))
    return path


def run(capsys: pytest.CaptureFixture[str], inv: Path, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(inv), "run", *args)


def statuses(doc: dict[str, Any], host: str) -> list[tuple[str, str]]:
    return [(r["name"], r["status"]) for r in doc["results"][host]]


def test_when_register_and_templates(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    path = book(tmp_path, [
        {"name": "write", "shell": f"echo host={{{{ inventory_hostname }}}} n={{{{ n }}}} > {out}/{{{{ n }}}}",
         "register": "w"},
        {"name": "only two", "shell": "echo two", "when": "n == 2", "register": "t"},
        {"name": "uses register", "assert": {"that": ["w.rc == 0", "t is skipped or t.stdout == 'two'"]}},
    ])
    r = run(capsys, inv, str(path), "--json")
    doc = r.json()
    assert r.rc == 0, r.err
    assert (out / "1").read_text() == "host=one n=1\n" and (out / "2").read_text() == "host=two n=2\n"
    assert statuses(doc, "one") == [("write", "changed"), ("only two", "skipped"), ("uses register", "ok")]
    assert statuses(doc, "two") == [("write", "changed"), ("only two", "changed"), ("uses register", "ok")]


def test_failed_host_drops_out_and_ignore_errors(inv: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = book(tmp_path, [
        {"name": "ignored", "shell": "exit 3", "ignore_errors": True},
        {"name": "fails one", "fail": "one is bad", "when": "inventory_hostname == 'one'"},
        {"name": "after", "shell": "true"},
    ])
    r = run(capsys, inv, str(path), "--json")
    doc = r.json()
    assert r.rc == 2 and doc["status"] == "failed"
    assert statuses(doc, "one") == [("ignored", "ignored"), ("fails one", "failed")]
    assert statuses(doc, "two") == [("ignored", "ignored"), ("fails one", "skipped"), ("after", "changed")]
    assert doc["results"]["one"][1]["msg"] == "one is bad"
    assert doc["recap"]["one"]["failed"] == 1 and doc["recap"]["two"]["failed"] == 0


def test_retries_until(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    counter = tmp_path / "count-{{ inventory_hostname }}"
    path = book(tmp_path, [{
        "name": "third time lucky", "shell": f"echo x >> {counter}; wc -l < {counter}", "register": "c",
        "until": "c.stdout | int >= 3", "retries": 5, "delay": 0,
    }, {"name": "gives up", "shell": "false", "register": "g", "until": "g.rc == 0", "retries": 1, "delay": 0}])
    r = run(capsys, inv, str(path), "--json")
    doc = r.json()
    assert (tmp_path / "count-one").read_text() == "x\nx\nx\n"
    assert doc["results"]["one"][1]["msg"].startswith("until 'g.rc == 0' still false after 2 attempts")
    assert r.rc == 2


def test_tags_and_start_at_task(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tasks = [{"name": "a", "shell": "true", "tags": ["x"]}, {"name": "b", "shell": "true", "tags": "y"},
             {"name": "c", "shell": "true", "tags": ["always"]}, {"name": "d", "shell": "true"}]
    path = book(tmp_path, tasks)
    tagged = run(capsys, inv, str(path), "--tags", "y", "--json").json()
    assert [n for n, _ in statuses(tagged, "one")] == ["b", "c"]
    skipped = run(capsys, inv, str(path), "--skip-tags", "x,y", "--json").json()
    assert [n for n, _ in statuses(skipped, "one")] == ["c", "d"]
    started = run(capsys, inv, str(path), "--start-at-task", "c", "--json").json()
    assert [n for n, _ in statuses(started, "one")] == ["c", "d"]
    bad = run(capsys, inv, str(path), "--start-at-task", "nope")
    assert bad.rc == 3 and "--start-at-task 'nope': no task has that name" in bad.err


def test_check_mode_runs_no_shell(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    path = book(tmp_path, [{"shell": f"touch {marker}"}, {"assert": {"that": "check_mode"}}])
    r = run(capsys, inv, str(path), "--check", "--json")
    assert r.rc == 0 and not marker.exists()
    assert statuses(r.json(), "one")[0][1] == "skipped"


def test_undefined_variable_at_runtime_names_file_and_line(inv: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = book(tmp_path, [{"name": "ok", "shell": "true"}, {"name": "typo", "shell": "echo {{ nn }}"}])
    r = run(capsys, inv, str(path), "--json")
    assert r.rc == 2
    msg = r.json()["results"]["one"][1]["msg"]
    assert msg == f"{path}:6: shell: UndefinedError: 'nn' is undefined in 'echo {{{{ nn }}}}'"


def test_resume_skips_hosts_that_finished(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, broken = tmp_path / "log", tmp_path / "broken-two"
    path = book(tmp_path, [{"shell": f"echo {{{{ inventory_hostname }}}} {{{{ who }}}} >> {log}"},
                           {"shell": f"test ! -e {tmp_path}/broken-{{{{ inventory_hostname }}}}"}], serial=1,
                max_failures=0)
    broken.touch()
    first = run(capsys, inv, str(path), "-e", "who=ops", "--json")
    run_id = first.json()["run_id"]
    assert first.rc == 2 and first.json()["status"] == "halted"
    broken.unlink()  # the cause mended on the host; the run goes on with its own -e who=ops
    again = run(capsys, inv, str(path), "--resume", run_id, "--json")
    assert again.rc == 0 and again.json()["status"] == "ok"
    assert log.read_text().splitlines() == ["one ops", "two ops", "two ops"]  # one finished: not run again
    journal = inv.parent / ".fleetctl" / "runs" / f"{run_id}.jsonl"
    kinds = [json.loads(line)["event"] for line in journal.read_text().splitlines()]
    assert kinds[0] == "run_start" and kinds.count("resume") == 1 and kinds.count("run_end") == 2
    wrong = run(capsys, inv, str(path), "--resume", "20990101-000000-nope")
    assert wrong.rc == 3 and "no run 20990101-000000-nope" in wrong.err


def _halted(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, str]:
    """A run halted on host two (serial 1), started with -l one,two -e who=ops."""
    log = tmp_path / "log"
    (tmp_path / "broken-two").touch()
    path = book(tmp_path, [{"shell": f"echo {{{{ inventory_hostname }}}} {{{{ who }}}} >> {log}"},
                           {"shell": f"test ! -e {tmp_path}/broken-{{{{ inventory_hostname }}}}"}], serial=1,
                max_failures=0)
    first = run(capsys, inv, str(path), "-l", "one,two", "-e", "who=ops", "--json")
    assert first.rc == 2 and first.json()["status"] == "halted", first.out
    return path, log, first.json()["run_id"]


def test_resume_refuses_other_variables_or_limit_and_prints_a_command_that_works(
        inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, log, run_id = _halted(inv, tmp_path, capsys)
    other = run(capsys, inv, str(path), "-e", "who=dev", "--resume", run_id)
    assert other.rc == 3 and other.err.strip().endswith(f"run {run_id} ran with -e who='ops', not 'dev'"), other.err
    new = run(capsys, inv, str(path), "-e", "extra=1", "--resume", run_id)
    assert new.rc == 3 and f"run {run_id} ran without -e extra (its -e: who)" in new.err, new.err
    wider = run(capsys, inv, str(path), "-l", "all", "--resume", run_id)
    assert wider.rc == 3 and f"run {run_id} ran with -l one,two, not -l all" in wider.err, wider.err
    assert log.read_text().split() == ["one", "ops", "two", "ops"]  # the refusals ran nothing
    halted = run(capsys, inv, str(path), "--resume", run_id)  # the printed hint: no -e, no -l
    assert f"--resume {run_id}" in " ".join(halted.out.split()) and halted.rc == 2


def test_a_checked_resume_leaves_the_runs_journal_alone(inv: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path, log, run_id = _halted(inv, tmp_path, capsys)
    journal = inv.parent / ".fleetctl" / "runs" / f"{run_id}.jsonl"
    before = journal.read_text()
    checked = run(capsys, inv, str(path), "--resume", run_id, "--check", "--json")
    assert checked.rc == 0 and checked.json()["run_id"] != run_id, checked.out
    assert journal.read_text() == before  # the real run's journal untouched: still halted
    (tmp_path / "broken-two").unlink()
    real = run(capsys, inv, str(path), "--resume", run_id, "--json")
    assert real.rc == 0 and real.json()["status"] == "ok"
    assert log.read_text().splitlines() == ["one ops", "two ops", "two ops"]  # two really ran again


def test_a_resume_refused_on_input_keeps_the_runs_verdict(inv: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path, _log, run_id = _halted(inv, tmp_path, capsys)
    inv.write_text(INVENTORY.replace("web:", "gpu:"))  # the play's group is gone from the inventory
    bad = run(capsys, inv, str(path), "--resume", run_id)
    assert bad.rc == 3, bad.out + bad.err
    listed = run_cli(capsys, "-i", str(inv), "runs", "list", "--json").json()
    assert [r["status"] for r in listed if r["run_id"] == run_id] == ["halted"], listed
    shown = run_cli(capsys, "-i", str(inv), "runs", "show", run_id)
    assert "no end recorded" not in shown.out, shown.out
    events = [json.loads(line) for line in (inv.parent / ".fleetctl" / "runs" / f"{run_id}.jsonl").open()]
    assert events[-1]["event"] == "resume_failed" and "web" in events[-1]["error"], events[-1]

