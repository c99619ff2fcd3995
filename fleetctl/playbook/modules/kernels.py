"""Playbook module ``kernels``: which tuned fused-MoE Triton configs this host gets (``kernels plan``).

The same core as ``fleetctl kernels plan`` (``fleetctl/kernels/``): the tuned folder is read and
validated once per run, the host says its GPU, triton and SGLang built-ins, and the plan says what
SGLang would load for each tuned file. Read-only, so it runs the same in check mode.
"""

from __future__ import annotations

from typing import Literal

from fleetctl import kernels as core
from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module, once

DEFAULT_DIR = "files/kernels"  # beside the playbooks: playbooks/files/kernels


class KernelsArgs(Args):
    action: Literal["plan"] = "plan"
    venv: str | None = None  # default: the host's venv var
    dir: str = DEFAULT_DIR  # the tuned configs on the controller, relative to the playbook
    strict: bool = False  # fail on a host with warnings (fallback, no tuned file, unknown GPU)


def plan_message(plan: core.KernelPlan) -> str:
    loads = {e.status for e in plan.entries}
    line = f"{len(plan.selected)} tuned files for {', '.join(plan.facts.device_names) or 'no known GPU'}"
    if plan.entries:
        line += " (" + ", ".join(f"{sum(e.status == s for e in plan.entries)} {s}" for s in sorted(loads)) + ")"
    if plan.refusals:
        line += f"; refused: {plan.refusals[0]}"
    if plan.warnings:
        line += f"; {len(plan.warnings)} warnings: {plan.warnings[0]}"
    return line


@module("kernels", KernelsArgs, free_form="action")
def kernels(mc: ModuleContext, args: KernelsArgs) -> TaskResult:
    """The tuned Triton configs this host gets and what SGLang would load for each (data: the plan);
    ``strict: true`` fails a host with warnings."""
    root = mc.path(args.dir)
    tuned = once(mc.run, ("kernels-tuned", str(root)), lambda: core.load_tuned(root))
    facts, texts = core.gather(mc.session, args.venv or mc.session.host.connection.venv,
                               texts_named=core.sibling_names(tuned))
    plan = core.plan_host(mc.host, facts, tuned, texts)
    failed = bool(plan.refusals) or (args.strict and bool(plan.warnings))  # a refusal: SGLang would stop
    return TaskResult(failed=failed, msg=plan_message(plan), data=plan.to_dict())
