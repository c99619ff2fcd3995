"""A ``release`` or ``service`` task's multi-node groups in step behind a gateway, as ``deploy``,
``rollback`` and ``service restart`` do (``release/group_sync.py``): a rank > 0 stops its server
only once its rank 0 is out of every gateway with 0 requests in flight, and rank 0 goes back into
the gateway only once every other rank of the task passed its gates.

The groups are the play's ``serial_group_var`` (which keeps each in one batch): its hosts get the
node vars ``fleetctl deploy`` gives them (``nodegroups.annotate``). A play without it runs each
host on its own, as before. ``on_failure``'s way back (``releases.py``) moves in step the same way
(``back_in_step``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from fleetctl.release import group_sync
from fleetctl.release.group_sync import GroupSync

if TYPE_CHECKING:
    from fleetctl.playbook.modules import TaskResult
    from fleetctl.playbook.play_schema import Play
    from fleetctl.playbook.schema import Task
    from fleetctl.playbook.state import RunnerView as Runner
    from fleetctl.transport.fleet import HostContext

IN_STEP = ("release", "service")  # the modules that stop servers behind a gateway
RunOne = Callable[["HostContext"], "TaskResult"]
T = TypeVar("T")


def in_step(runner: Runner, play: Play, task: Task, hosts: list[str], fn: RunOne) -> tuple[RunOne, list[str]]:
    """``fn`` (one host's task) and ``hosts``, rank 0 first, sharing one GroupSync for the task; as
    they were when the task is no such module, or the play names no group var."""
    var = play.model.serial_group_var
    if task.module.name not in IN_STEP or not var or task.options.run_once or task.options.delegate_to:
        return fn, hosts
    from fleetctl.release.nodegroups import annotate

    contexts = runner.fleet.contexts
    annotate({h: contexts[h] for h in hosts}, runner.fleet.inventory.hosts, var)  # --check plans by them too
    if runner.options.check:  # nothing stops: nobody waits
        return fn, hosts
    sync = GroupSync.for_hosts(contexts, hosts, threads=runner.fleet.settings.forks)
    if not sync.group:
        return fn, hosts
    for host in hosts:
        contexts[host].node_sync = sync

    def run(ctx: HostContext) -> TaskResult:
        try:
            return group_sync.ending(sync, ctx.name, lambda: fn(ctx), lambda r: (not r.failed, r.msg))
        finally:
            ctx.node_sync = None  # a later task (a rollback) waits on nothing of this one

    return run, sorted(hosts, key=lambda h: sync.rank.get(h, 0))


def back_in_step(runner: Runner, play: Play, hosts: list[str], fn: Callable[[HostContext], T]
                 ) -> tuple[Callable[[HostContext], T], list[str]]:
    """A rollback's ``fn`` and ``hosts`` (rank 0 first) in step: a rank > 0 stops only once its rank 0
    drained. A rank whose rank 0 is not rolled back goes at once (that rank 0 is not serving it)."""
    var = play.model.serial_group_var
    if not var:
        return fn, hosts
    from fleetctl.release.nodegroups import annotate

    contexts = runner.fleet.contexts
    annotate({h: contexts[h] for h in hosts}, runner.fleet.inventory.hosts, var)
    sync = GroupSync.for_hosts(contexts, hosts, leaderless_ok=True, threads=runner.fleet.settings.forks)
    if not sync.group:
        return fn, hosts

    def run(ctx: HostContext) -> T:
        contexts[ctx.name].node_sync = sync
        try:
            return group_sync.ending(sync, ctx.name, lambda: fn(ctx), lambda v: (True, ""))
        finally:
            contexts[ctx.name].node_sync = None

    return run, sorted(hosts, key=lambda h: sync.rank.get(h, 0))
