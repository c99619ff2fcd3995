"""Approval before a batch: the play's gate for CI and chat-ops (``approval``), ``fleetctl run --step``
on a terminal, and ``fleetctl runs abort`` from anywhere.

The gate is Argo Rollouts' indefinite ``pause`` step and its ``promote`` / ``abort``:

    approval: {before_batch: 2, timeout: 600, on_timeout: abort}

``before_batch`` (a batch number, a list of them, or ``each``: every batch after the canary; default
2, right after the canary) makes the rollout stop before that batch, journal ``approval_wait`` and wait
for ``fleetctl runs promote RUN_ID`` (go on) or ``fleetctl runs abort RUN_ID`` (halt; ``on_failure``
applies, as Argo's abort goes back to stable) from another shell. After ``timeout`` seconds
``on_timeout`` decides (``abort`` by default: a gate nobody approved does not open). Every answer is an
``approval`` event naming who gave it and how long the rollout waited; the time waited does not count
against ``progress_deadline`` (Argo's paused time does not either). In check mode the gate is
journaled and not waited for. ``runs abort`` on a run that is not at a gate stops it before its next
batch.

The other shell talks to the run through one file beside its journal, ``RUN_ID.decision``, written
atomically by ``runs promote|abort`` and taken (deleted) by the run; only the run writes its journal.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fleetctl.errors import InputError
from fleetctl.playbook.play_schema import Approval

if TYPE_CHECKING:
    from fleetctl.playbook.state import Rollout
    from fleetctl.playbook.state import RunnerView as Runner

POLL = 0.25  # seconds between looks at the decision file


def decision_path(journal: Path) -> Path:
    return journal.with_suffix(".decision")


# -- in the run ------------------------------------------------------------------------------------

def before_batch(runner: Runner, ro: Rollout, b: int) -> None:
    """Before batch ``b`` (0-based) starts: an abort asked for, the play's gate, then ``--step``."""
    if runner.stopping:
        return
    taken = _take(decision_path(runner.journal.path), None)
    if taken:  # `runs abort` while the run was not at a gate
        runner.emit("approval", play=ro.play.index, batch=b + 1, decision="abort", by=_by(taken), waited=0)
        runner.halt(ro, b - 1, f"aborted before batch {b + 1} by {_by(taken)} (fleetctl runs abort)")
    gate = ro.play.model.approval
    if gate is not None and gate.waits_before(b + 1):
        _gate(runner, ro, b, gate)
    step(runner, ro, b)


def _gate(runner: Runner, ro: Rollout, b: int, gate: Approval) -> None:
    play, batch, run_id = ro.play, ro.plan[b], runner.journal.run_id
    fields = {"play": play.index, "batch": b + 1}
    if runner.options.check:
        runner.emit("approval", **fields, decision="skipped", by=None, waited=0, msg="check mode: not waited for")
        return
    runner.emit("approval_wait", **fields, batches=len(ro.plan), hosts=batch, timeout=gate.timeout,
                on_timeout=gate.on_timeout, promote=f"fleetctl runs promote {run_id}",
                abort=f"fleetctl runs abort {run_id}")
    path = decision_path(runner.journal.path)
    start = time.monotonic()
    taken = None
    while not runner.stopping and time.monotonic() - start < gate.timeout:
        taken = _take(path, (play.index, b + 1))
        if taken:
            break
        runner.wait(min(POLL, max(0.0, gate.timeout - (time.monotonic() - start))))
    waited = round(time.monotonic() - start, 3)
    if runner.deadline is not None:
        runner.deadline += waited
    if runner.stopping and not taken:
        return  # Ctrl-C: the runner journals the interruption
    decision = taken["decision"] if taken else gate.on_timeout
    by = _by(taken) if taken else f"timeout {gate.timeout:g}s (on_timeout: {gate.on_timeout})"
    runner.emit("approval", **fields, decision=decision, by=by, waited=waited,
                asked=taken.get("ts") if taken else None)
    if decision == "abort":
        why = (f"aborted at the approval gate before batch {b + 1} by {by} (fleetctl runs abort)" if taken else
               f"approval gate before batch {b + 1}: no promote within {gate.timeout:g}s (on_timeout: abort)")
        runner.halt(ro, b - 1, why)


STEP_QUESTION = ("[bold]STEP[/] {play}: batch {batch}/{batches} ({hosts}): run it? "
                 "[bold]y[/]es / [bold]n[/]o, stop the rollout here / [bold]c[/]ontinue, no more questions: ")
ANSWERS = {"y": "yes", "yes": "yes", "n": "no", "no": "no", "c": "continue", "continue": "continue"}


def step(runner: Runner, ro: Rollout, b: int) -> None:
    """``--step``: the batch runs once the terminal says y (or c: and every later one); n halts."""
    op = runner.options.operator
    if not op.step or op.asked_all or op.terminal is None:
        return
    from rich.markup import escape

    question = STEP_QUESTION.format(play=escape(ro.play.name), batch=b + 1, batches=len(ro.plan),
                                    hosts=escape(", ".join(ro.plan[b])))
    answer = None
    while answer is None:
        typed = op.terminal.ask(question, op.stopping)
        if typed is None:  # Ctrl-C, or the terminal closed: stop as Ctrl-C does
            runner.stop()
            return
        answer = ANSWERS.get(typed.lower())
    runner.emit("step", play=ro.play.index, batch=b + 1, hosts=ro.plan[b], answer=answer)
    if answer == "continue":
        op.asked_all = True
    elif answer == "no":
        runner.halt(ro, b - 1, f"--step: batch {b + 1} declined at the terminal")


def _take(path: Path, gate: tuple[int, int] | None) -> dict[str, Any] | None:
    """The decision for ``gate`` (play, batch), or an abort (any time). The file is always taken: a
    promote for another gate is stale (that gate was answered, or it is not waited at yet)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError:
        text = ""
    path.unlink(missing_ok=True)
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if doc.get("decision") == "abort":
        return doc
    fits = gate is not None and doc.get("decision") == "promote" and (doc.get("play"), doc.get("batch")) == gate
    return doc if fits else None


def _by(doc: dict[str, Any]) -> str:
    return f"{doc.get('user', '?')}@{doc.get('controller', '?')}"


def clear(journal: Path) -> None:
    """A resumed run starts with no decision left from before."""
    decision_path(journal).unlink(missing_ok=True)


# -- from another shell ----------------------------------------------------------------------------

def request(folder: Path, run_id: str, decision: Literal["promote", "abort"], wait: float = 15.0) -> str:
    """``fleetctl runs promote|abort RUN_ID``: leave the decision for the run; what happened, in words."""
    from fleetctl.liveness import process_start, who
    from fleetctl.runs.journal import find_run, read_events

    path = find_run(folder, run_id)
    run_id = path.stem
    events = read_events(path)
    end = next((e for e in reversed(events) if e.get("event") == "run_end"), None)
    if end is not None:
        raise InputError(f"run {run_id} has ended ({end.get('status', '?')}): nothing to {decision}")
    start: dict[str, Any] = next((e for e in reversed(events) if e.get("event") in ("run_start", "resume")), {})
    holder = start.get("who") or {}
    if holder.get("controller") == socket.gethostname() and holder.get("pid") and \
            process_start(int(holder["pid"])) != holder.get("pid_start"):
        raise InputError(f"run {run_id} is not running: its controller (pid {holder['pid']}) is gone; "
                         f"go on with `fleetctl run PLAYBOOK --resume {run_id}`")
    waiting = _waiting(events)
    if decision == "promote" and waiting is None:
        raise InputError(f"run {run_id} is not waiting at an approval gate (`runs promote` answers a gate; "
                         "`runs abort` stops a run before its next batch)")
    me = who(f"fleetctl runs {decision} {run_id}")
    doc = {"decision": decision, "user": me["user"], "controller": me["controller"], "ts": round(time.time(), 3),
           **({"play": waiting["play"], "batch": waiting["batch"]} if waiting else {})}
    target = decision_path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(doc))
    os.replace(tmp, target)
    if waiting is None:
        return f"run {run_id}: abort requested; it stops before its next batch"
    gate = f"batch {waiting['batch']} ({', '.join(waiting.get('hosts') or [])})"
    until = time.monotonic() + wait
    while target.exists() and time.monotonic() < until:
        time.sleep(0.1)
    if target.exists():
        return f"run {run_id}: {decision} left for the gate before {gate}; the run has not taken it yet"
    return (f"run {run_id}: promoted; {gate} starts" if decision == "promote" else
            f"run {run_id}: aborted at the gate before {gate}; on_failure applies")


def _waiting(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The gate the run waits at now (its last ``approval_wait`` not yet answered), or None."""
    for e in reversed(events):
        if e.get("event") in ("approval", "run_start", "resume", "halted", "interrupted"):
            return None
        if e.get("event") == "approval_wait":
            return e
    return None
