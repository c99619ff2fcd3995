"""Commands run host by host in batches with a failure budget: ``deploy``/``rollback --serial`` and
``fleetctl service`` (without ``--serial`` every host is one batch, journaled the same way). One
code path with playbooks: the batches and the budgets are
``runs/rollout.py``'s (``batches``, ``Budget``), so ``--serial 1 --serial 50%`` means exactly
what ``serial: [1, "50%"]`` means in a play, and a grouping variable keeps a multi-node server's
hosts in one batch. Every batch and host start and end is an event in a run journal under
``.fleetctl/runs/`` beside the inventory (``fleetctl runs list|show``). With ``claims`` the run owns
its hosts (``ownership.py``): every host's lock is taken before the first batch and held to the end,
so a second deploy or rollout cannot slip into a later batch's host; a host another run holds fails
with the lock's line and is not touched.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fleetctl.errors import HostError
from fleetctl.release import group_sync
from fleetctl.release.group_sync import GroupSync
from fleetctl.release.ownership import RunClaims
from fleetctl.runs import rollout
from fleetctl.runs.journal import Journal, runs_dir
from fleetctl.secrets import Redactor
from fleetctl.transport.base import HostResult, Status
from fleetctl.transport.fleet import Fleet, HostContext

T = TypeVar("T")


@dataclass(frozen=True)
class Rollout:
    """What ``--serial``, ``--max-fail-percentage``, ``--max-failures`` and ``--group-by`` asked for."""

    serial: tuple[int | str, ...] = ()
    budget: rollout.Budget = field(default_factory=rollout.Budget)
    group_var: str | None = None

    @property
    def batched(self) -> bool:
        return bool(self.serial)


@dataclass
class BatchedRun:
    results: dict[str, HostResult[Any]]
    plan: list[list[str]]
    halted: str | None = None  # why the rollout stopped before its last batch
    skipped: list[str] = field(default_factory=list)  # hosts of batches never started
    journal: str | None = None


def run_batched(fleet: Fleet, fn: Callable[[HostContext], T], how: Rollout, command: str,
                ok: Callable[[HostResult[T]], bool], inventory_folder: Path,
                claims: RunClaims | None = None,
                after_batch: Callable[[dict[str, HostResult[T]]], None] | None = None) -> BatchedRun:
    """``fn`` on every host, batch after batch; stops when the budget is exceeded (the hosts of the
    batches not started are left out of ``results`` and listed in ``skipped``). ``after_batch`` may
    change a batch's results before they are judged (a multi-node group sent back as one)."""
    names = sorted(fleet.contexts)
    plan = rollout.batches(names, list(how.serial) or None, rollout.group_of(fleet, how.group_var))
    journal = Journal.create(runs_dir(inventory_folder), Path(command.split()[1] if " " in command else command),
                             Redactor.for_hosts(ctx.vars for ctx in fleet.contexts.values()))
    journal.event("run_start", run_id=journal.run_id, playbook=command, check=False, hosts=names,
                  serial=list(how.serial))
    run = BatchedRun({}, plan, journal=str(journal.path))
    failed_total = 0
    refused: dict[str, HostResult[Any]] = {}
    try:
        if claims is not None:
            claims.start(journal.run_id)
            refused = {h: r for h, r in fleet.map(claims.claim, names=names).items() if not r.ok}
        for b, batch in enumerate(plan):
            journal.event("batch_start", play=0, batch=b + 1, batches=len(plan), hosts=batch)
            others = [h for h in names if h not in batch]  # a live canary's baseline hosts are among these
            sync = GroupSync.for_hosts(fleet.contexts, batch, threads=fleet.settings.forks)
            for host in batch:
                fleet.contexts[host].peers = functools.partial(reachable_contexts, fleet, others)
                fleet.contexts[host].node_sync = sync
            # a multi-node group's rank 0 first: its ranks > 0 wait for its drain (group_sync.py)
            order = sorted(batch, key=lambda h: sync.rank.get(h, 0))
            results = fleet.map(functools.partial(_journaled, journal, fn=fn, batch=b + 1, command=command,
                                                  refused=refused), names=order)
            if after_batch is not None:
                after_batch(results)
            failed = [h for h in batch if not ok(results[h])]
            for host in batch:
                res = results[host]
                status = "ok" if ok(res) else "failed"
                journal.event("task_result", play=0, batch=b + 1, host=host, name=command, status=status,
                              msg=res.reason or "")
                journal.event("host_done", play=0, host=host, status=status, msg=res.reason or "")
            journal.event("batch_end", play=0, batch=b + 1, failed=failed)
            run.results.update(results)
            failed_total += len(failed)
            why = how.budget.exceeded(len(failed), len(batch), failed_total)
            if why and b + 1 < len(plan):
                run.halted = f"{why}: stopped after batch {b + 1} of {len(plan)}"
                run.skipped = [h for rest in plan[b + 1:] for h in rest]
                journal.event("halted", play=0, batch=b + 1, why=run.halted, skipped=run.skipped,
                              not_started=run.skipped, on_failure="stop")
                break
    finally:
        if claims is not None:
            claims.release_all()
        recap = {h: {"ok": int(ok(r)), "failed": int(not ok(r))} for h, r in run.results.items()}
        status = "halted" if run.halted else ("ok" if all(ok(r) for r in run.results.values()) else "failed")
        journal.event("run_end", status=status, recap=recap)
        journal.close()
    return run


def reachable_contexts(fleet: Fleet, names: list[str]) -> list[HostContext]:
    """The contexts of ``names`` still reachable: a live canary's baseline hosts (``HostContext.peers``)."""
    return [fleet.contexts[n] for n in names if not fleet.contexts[n].unreachable]


def _journaled(journal: Journal, ctx: HostContext, *, fn: Callable[[HostContext], T], batch: int, command: str,
               refused: dict[str, HostResult[Any]]) -> T:
    journal.event("task_start", play=0, batch=batch, host=ctx.name, name=command, started=time.time())

    def change() -> T:
        if ctx.name in refused:  # another run holds it (or it failed when the run took it): not touched
            raise HostError(ctx.name, refused[ctx.name].reason or "not taken by this run")
        return fn(ctx)

    return group_sync.ending(group_sync.of(ctx), ctx.name, change)


def skipped_results(run: BatchedRun) -> dict[str, HostResult[Any]]:
    """Every host in plan order: the ones a halt left out as failed with the halt's reason."""
    out: dict[str, HostResult[Any]] = {}
    for host in (h for batch in run.plan for h in batch):
        out[host] = run.results.get(host) or HostResult(host, Status.FAILED, reason=f"not started: {run.halted}")
    return out
