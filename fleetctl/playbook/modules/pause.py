"""``pause``: wait ``seconds`` or ``minutes``, or until Enter is pressed at the ``prompt`` on the
controller's terminal. As Ansible's, it runs once per batch (not once per host) and its result is
every host's. A prompt without a time needs a terminal: without one (CI) the run is refused before
it starts (``fleetctl run``), and the module fails with that line if it is reached anyway: never a
wait for an answer that cannot come. Ctrl-C ends a pause early and the run stops as after any task.
The task's result (what was typed, how long it waited) is journaled like any other."""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field, model_validator

from fleetctl.playbook.interact import NO_TERMINAL
from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module

DEFAULT_PROMPT = "Press Enter to continue, Ctrl-C to stop"


class PauseArgs(Args):
    seconds: float | None = Field(default=None, ge=0)
    minutes: float | None = Field(default=None, ge=0)
    prompt: str | None = None

    @model_validator(mode="after")
    def _one_time(self) -> PauseArgs:
        if self.seconds is not None and self.minutes is not None:
            raise ValueError("give seconds or minutes, not both")
        return self

    @property
    def wait(self) -> float | None:
        return self.seconds if self.seconds is not None else None if self.minutes is None else self.minutes * 60


def needs_terminal(raw: Any) -> bool:
    """A pause that waits for Enter (no seconds or minutes): it needs someone at a terminal."""
    return not (isinstance(raw, dict) and (raw.get("seconds") is not None or raw.get("minutes") is not None))


@module("pause", PauseArgs, free_form="prompt", run_once=True)
def pause(mc: ModuleContext, args: PauseArgs) -> TaskResult:
    """Wait ``seconds``/``minutes``, or for Enter at ``prompt`` on the terminal (with a time too: Enter
    ends the wait early). Registers ``user_input`` (the line typed) and ``delta`` (seconds waited)."""
    operator = mc.run.operator
    wait = args.wait
    start = time.monotonic()
    typed = ""
    if operator.terminal is not None and (wait is None or args.prompt is not None):
        answer = operator.terminal.ask(f"[bold]PAUSE[/] {_esc(args.prompt or DEFAULT_PROMPT)}: ", operator.stopping,
                                       wait)
        stopped = answer is None and operator.stopping()
        typed = answer or ""
        if answer is None and wait is None and not stopped:
            return TaskResult(failed=True, msg="pause: the terminal closed before Enter was pressed")
    elif wait is None:
        return TaskResult(failed=True, msg=f"pause: a prompt waits for Enter on a terminal, and {NO_TERMINAL} "
                                           "(in CI give seconds/minutes, or use the play's approval gate)")
    else:
        stopped = not operator.wait(wait)
    delta = round(time.monotonic() - start, 3)
    if stopped:
        msg = f"ended early by Ctrl-C after {delta:g}s"
    elif wait is not None and not typed:
        msg = f"paused {wait:g}s"
    else:
        msg = f"continued after {delta:g}s" + (f": {typed!r}" if typed else "")
    return TaskResult(msg=msg, data={"user_input": typed, "delta": delta})


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)
