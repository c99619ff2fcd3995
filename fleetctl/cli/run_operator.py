"""What ``fleetctl run`` may ask of the person at the controller (``--step``, ``pause`` prompts), and
``fleetctl runs promote|abort RUN_ID``: the answers to a play's approval gate from another shell."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Literal

import click

from fleetctl import render
from fleetctl.cli import complete
from fleetctl.cli.context import AppContext
from fleetctl.errors import InputError
from fleetctl.playbook.interact import NO_TERMINAL, Operator, Terminal
from fleetctl.playbook.play_schema import Playbook


def operator_for(playbook: Playbook, step: bool, write: Callable[[str], None],
                 hold: Callable[[], AbstractContextManager[object]]) -> Operator:
    """The run's operator: the terminal when stdin is one; without it a question that would wait
    for an answer (``--step``, a ``pause`` with a prompt and no time) is refused before anything runs."""
    from fleetctl.playbook.modules.pause import needs_terminal

    if sys.stdin is not None and sys.stdin.isatty():
        return Operator(Terminal(sys.stdin.fileno(), write, hold), step)
    if step:
        raise InputError(f"--step asks before each batch on a terminal, and {NO_TERMINAL} (in CI give the play "
                         "an `approval` gate and answer it with `fleetctl runs promote RUN_ID`)")
    for task in playbook.tasks():
        if task.module.name == "pause" and needs_terminal(task.args):
            raise InputError(f"{task.where(playbook.path)}: pause: a prompt waits for Enter on a terminal, and "
                             f"{NO_TERMINAL} (in CI give it seconds or minutes, or use the play's `approval` gate)")
    return Operator(None, step)


def _answer(app: AppContext, run_id: str, decision: Literal["promote", "abort"]) -> int:
    from fleetctl.playbook.approval import request
    from fleetctl.runs.journal import runs_dir

    said = request(runs_dir(app.inventory.folder), run_id, decision)
    if app.json:
        render.emit_json({"run_id": run_id, "decision": decision, "result": said})
    else:
        render.console().print(render.cell(said), soft_wrap=True)
    return 0


@click.command(name="promote")
@click.argument("run_id", shell_complete=complete.run_ids)
@click.pass_obj
def promote(app: AppContext, run_id: str) -> int:
    """Open the approval gate RUN_ID waits at: its next batch starts (journaled with who said so)."""
    return _answer(app, run_id, "promote")


@click.command(name="abort")
@click.argument("run_id", shell_complete=complete.run_ids)
@click.pass_obj
def abort(app: AppContext, run_id: str) -> int:
    """Stop RUN_ID at its approval gate (or before its next batch): halted, `on_failure` applies."""
    return _answer(app, run_id, "abort")
