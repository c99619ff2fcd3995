"""Playbook module ``drift``: this host's venv against a baseline host or a lock file; failed when it drifts.

The same core as ``fleetctl drift`` (``fleetctl/drift.py``): this host's inventory is collected,
the baseline host's once per run (shared by every host of the run, through the run's memo), and
the findings are this host's only. Read-only, so it runs the same in check mode.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from fleetctl import drift as core
from fleetctl.errors import ConnectError, HostError
from fleetctl.playbook.modules.base import Args, ModuleContext, RunServices, TaskResult, module
from fleetctl.transport.base import HostResult, Status

T = TypeVar("T")
SHOWN_FINDINGS = 3  # in the one-line message; data holds them all


# --- shared by the playbook modules drift, venv, kernels, probe, files (candidates for base.py) ----------

def key_error(model: str, key: str, message: str, value: Any = None) -> ValidationError:
    """A validation error located at ``key`` (raised from a model validator): the runner's schema
    check then names that key and its line, not just the task."""
    detail = InitErrorDetails(type=PydanticCustomError("value_error", message), loc=(key,), input=value)
    return ValidationError.from_exception_data(model, [detail])


class Once:
    """A value computed once per run by whichever host asks first; the others wait for it. Errors
    are kept too, so a baseline host that is down is asked once, not once per host."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def get(self, compute: Callable[[], Any]) -> Any:
        with self.lock:
            if not self.done:
                try:
                    self.value = compute()
                except Exception as exc:
                    self.error = exc
                self.done = True
        if self.error is not None:
            raise self.error
        return self.value


def once(run: RunServices, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` once per run and key. Only the lookup holds the run's memo lock: a slow
    computation (a remote call) blocks only the hosts waiting for that same key."""
    with run.memo_lock:
        entry = run.memo.setdefault(("playbook-once", key), Once())
    value: T = entry.get(compute)
    return value


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


@contextmanager
def other_host_errors(mc: ModuleContext, role: str) -> Iterator[None]:
    """Work that touches another host (a baseline, an overlay source): when that host cannot be
    reached, this host fails naming it; it is not marked unreachable itself."""
    try:
        yield
    except ConnectError as exc:
        if exc.host == mc.host:
            raise
        raise HostError(mc.host, f"{role} {exc.host} is unreachable: {exc.reason}") from None


def on_other_host(mc: ModuleContext, role: str, key: Hashable, compute: Callable[[], T]) -> T:
    """``once(compute)`` for work on another host, its unreachability this host's plain failure."""
    with other_host_errors(mc, role):
        return once(mc.run, key, compute)


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
