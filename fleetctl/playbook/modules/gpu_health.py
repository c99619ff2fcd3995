"""Playbook module ``gpu_health``: this host's GPU health (``fleetctl gpu health``'s core); failed when red.

The rules are ``fleetctl/gpu/health.py``, the thresholds the host's variables as the task sees them
(inventory < play vars < ``-e``). Read-only, so it runs the same in check mode. Put before a
``release`` task, a red host fails here and the release never runs on it: the runner drops it from
the play and counts it against the play's failure budget like any failed host.
"""

from __future__ import annotations

from typing import Literal

from fleetctl.gpu.health import Level, Thresholds
from fleetctl.gpu.report import check_host
from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module


class GpuHealthArgs(Args):
    fail_on: Literal["red", "amber"] = "red"  # amber: fail on amber checks too


@module("gpu_health", GpuHealthArgs)
def gpu_health(mc: ModuleContext, args: GpuHealthArgs) -> TaskResult:
    """Fail when this host's GPU health is red (or amber, with ``fail_on: amber``); data: the report."""
    report = check_host(mc.session, Thresholds.from_vars(mc.vars, mc.host))
    failed = report.level.rank >= Level(args.fail_on).rank
    return TaskResult(failed=failed, msg=f"GPU health {report.summary()}",
                      data={"gpu_health": report.to_dict(), "level": report.level.value})
