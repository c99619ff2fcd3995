"""``set_fact`` (host variables set by the play) and ``debug`` (a message or a variable shown)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module

MAX_SHOWN = 2000


class SetFactArgs(Args):
    model_config = ConfigDict(extra="allow")

    cacheable: bool = False  # accepted for Ansible's sake: there is no fact cache

    @model_validator(mode="after")
    def _some(self) -> SetFactArgs:
        if not self.model_extra:
            raise ValueError("set_fact needs at least one variable to set")
        return self


@module("set_fact", SetFactArgs)
def set_fact(mc: ModuleContext, args: SetFactArgs) -> TaskResult:
    """Set host variables (templates already rendered) for the rest of the run; ok, never changed."""
    facts = dict(args.model_extra or {})
    return TaskResult(msg=", ".join(sorted(facts)), data={"ansible_facts": facts}, set_vars=facts)


class DebugArgs(Args):
    msg: Any = None
    var: str | None = None  # an expression, shown with its value
    verbosity: int = Field(default=0, ge=0)  # accepted; fleetctl shows every debug

    @model_validator(mode="after")
    def _one(self) -> DebugArgs:
        if self.msg is not None and self.var is not None:
            raise ValueError("debug takes msg or var, not both")
        return self


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 3] + "..."


@module("debug", DebugArgs, free_form="msg")
def debug(mc: ModuleContext, args: DebugArgs) -> TaskResult:
    """Show ``msg`` (default "Hello world!") or ``var`` (a variable or expression) and its value."""
    if args.var is not None:
        from fleetctl.templating import TemplateProblem

        try:
            value = mc.run.evaluate(args.var, mc.vars)
        except TemplateProblem:
            value = "VARIABLE IS NOT DEFINED!"  # Ansible's wording; the task stays ok
        return TaskResult(msg=f"{args.var}: {_shown(value)}", data={args.var: value})
    msg = "Hello world!" if args.msg is None else args.msg
    return TaskResult(msg=_shown(msg), data={"msg": msg})
