"""Playbook module ``drift``: this host's venv against a baseline host or a lock file; failed when it drifts.

The same core as ``fleetctl drift`` (``fleetctl/drift/audit.py``): this host's inventory is collected,
the baseline host's once per run (shared by every host of the run, through the run's memo), and
the findings are this host's only. Read-only, so it runs the same in check mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import field_validator, model_validator

from fleetctl.drift import audit as core
from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module, on_other_host, once
from fleetctl.transport.base import HostResult, Status

T = TypeVar("T")
SHOWN_FINDINGS = 3  # in the one-line message; data holds them all


class DriftArgs(Args):
    venv: str | None = None  # default: each host's venv var (the baseline host's own, for the baseline)
    baseline: str | None = None  # an inventory host
    lock: str | None = None  # a lock file on the controller, relative to the playbook
    packages: list[str] = []
    verify_files: bool = False
    skip: list[core.Kind] = []

    @model_validator(mode="after")
    def _one_baseline(self) -> DriftArgs:
        if (self.baseline is None) == (self.lock is None):
            raise ValueError("drift needs exactly one of baseline (a host) and lock (a file)")
        return self

    @field_validator("venv")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r}: expected an absolute path on the hosts")
        return value


def summary(findings: list[core.Finding], source: str) -> str:
    drifting = [f for f in findings if f.kind not in core.INFO_KINDS]
    if not drifting:
        return f"no drift from {source}"
    shown = "; ".join(f.detail for f in drifting[:SHOWN_FINDINGS])
    more = f" (+{len(drifting) - SHOWN_FINDINGS} more)" if len(drifting) > SHOWN_FINDINGS else ""
    return f"{len(drifting)} findings vs {source}: {shown}{more}"


def _ok(host: str, inv: core.HostInventory) -> HostResult[core.HostInventory]:
    return HostResult(host, Status.OK, value=inv)


@module("drift", DriftArgs)
def drift(mc: ModuleContext, args: DriftArgs) -> TaskResult:
    """Fail when this host's venv drifts from the ``baseline`` host's or from a ``lock`` file."""
    from fleetctl.lockfile import parse_lock

    mine = core.collect(mc.session, args.venv, args.verify_files)
    results = {mc.host: _ok(mc.host, mine)}
    lock = None
    if args.lock is not None:
        path: Path = mc.path(args.lock)
        lock = (once(mc.run, ("drift-lock", str(path)), lambda: parse_lock(path)), args.lock)
    elif args.baseline is not None and args.baseline != mc.host:
        base = args.baseline
        # The baseline's versions and stack only: its own file check is not needed by anyone here.
        base_inv = on_other_host(mc, "baseline", ("drift-baseline", base, args.venv),
                                 lambda: core.collect(mc.run.session(base), args.venv, False))
        results[base] = _ok(base, base_inv)
    report = core.audit(results, baseline_host=args.baseline if lock is None else None, lock=lock,
                        packages=args.packages, skip=[k.value for k in args.skip])
    findings = report.findings[mc.host]
    drifts = mc.host in report.drifting_hosts
    return TaskResult(failed=drifts, msg=summary(findings, report.baseline.source), data={
        "baseline": report.baseline.source, "drift": drifts, "findings": [f.to_dict() for f in findings]})
