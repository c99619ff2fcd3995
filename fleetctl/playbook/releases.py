"""Releases in a rollout: the release each host ran before it (recorded when the play starts, kept
across --resume), and ``on_failure``: ``rollback_failed`` / ``rollback_all`` switch hosts back to it,
between the play's ``before_rollback`` tasks (a drain at the load balancer) and its
``after_rollback`` tasks (the undrain: run on every host rolled back, whatever happened to it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from fleetctl.errors import HostError
from fleetctl.runs import journal as journal_mod
from fleetctl.transport.base import Status
from fleetctl.transport.fleet import HostContext

if TYPE_CHECKING:
    from fleetctl.playbook.play_schema import Play
    from fleetctl.playbook.state import RunnerView as Runner

T = TypeVar("T")


def as_release(runner: Runner, play: Play, fn: Callable[[HostContext], T]) -> Callable[[HostContext], T]:
    """``fn`` on the session the play's release task runs under (its become keyword, else the
    play's): what a rollback writes needs the privileges the deploy had."""
    task = next((t for t in play.tasks if t.module.name == "release"), None)
    become = task.options.become if task and task.options.become is not None else play.model.become
    user = (task.options.become_user if task else None) or play.model.become_user
    return lambda ctx: fn(runner.services.session_as(ctx.name, become, user))


def record_releases(runner: Runner, play: Play, hosts: list[str]) -> tuple[dict[str, str | None], dict[str, str]]:
    """The release each host runs before this rollout (from the resumed run's journal when it
    recorded the host: a resumed rollout still rolls back to what ran before it first started), and
    the hosts another run holds (a real run takes each host's lock here, for the whole run:
    ``release/ownership.py``)."""
    from fleetctl.playbook.modules.release import current_release

    events = runner.options.resume_events or []
    before = journal_mod.recorded_releases(events).get(play.index, {})
    claims = runner.services.claims
    if claims is not None:
        ours = releases_put_by(events)
        found = runner.fleet.map(as_release(runner, play, lambda ctx: claims.claim(
            ctx, before.get(ctx.name), ctx.name in before, ours.get(ctx.name, ()))), names=hosts)
    else:  # check mode: nothing is taken
        missing = [h for h in hosts if h not in before]
        found = runner.fleet.map(as_release(runner, play, current_release), names=missing) if missing else {}
    recorded = {**before, **{h: r.value for h, r in found.items() if r.ok}}
    refused = {h: r.reason or "" for h, r in found.items() if r.status is Status.FAILED}
    # A host not reached is not recorded, so a resumed run asks it again.
    runner.emit("recorded", play=play.index, releases={h: recorded[h] for h in hosts if h in recorded},
                unreachable={h: r.reason for h, r in found.items() if r.status is Status.UNREACHABLE},
                refused=refused)
    return recorded, refused


def releases_put_by(events: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per host: the releases a resumed run's tasks put there (its own, not another run's)."""
    out: dict[str, set[str]] = {}
    for e in events:
        if e.get("event") == "task_result" and e.get("release") and e.get("status") in ("ok", "changed"):
            out.setdefault(str(e.get("host")), set()).add(str(e["release"]))
    return out


def refuse_hosts(runner: Runner, play: Play, hosts: list[str], refused: dict[str, str]) -> list[str]:
    """The hosts this run could not take (another run holds them): failed with the lock's line, left
    out of the play (never touched), and the others."""
    for host, why in refused.items():
        runner.recap[host]["failed"] += 1
        entry = {"play": play.index, "task": None, "name": "take the host", "host": host, "status": "failed",
                 "msg": why, "changed": False, "rolled_back": False}
        runner.results.setdefault(host, []).append(entry)
        runner.emit("task_result", **entry)
        runner.emit("host_done", play=play.index, host=host, status="failed")
    runner.failed_before |= set(refused)
    return [h for h in hosts if h not in refused]


def on_failure(runner: Runner, play: Play, recorded: dict[str, str | None], attempted: list[str],
               failed: list[str], b: int = -1) -> None:
    how = play.model.on_failure
    if how == "halt":
        return
    targets = group_peers(runner, play, failed, attempted) if how == "rollback_failed" else attempted
    if runner.options.check:
        runner.emit("rollback", play=play.index, hosts=targets, status="skipped", msg="check mode: nothing to undo")
        return
    runner.deadline = None  # the rollout is over: its deadline does not cut the way back short
    hooks = _hooks(runner, play, b, targets)
    hooks("before_rollback", targets)  # a host that fails its drain is still rolled back
    try:
        _roll_back(runner, play, recorded, targets)
    finally:
        hooks("after_rollback", targets)


def group_peers(runner: Runner, play: Play, failed: list[str], attempted: list[str]) -> list[str]:
    """The failed hosts and, with ``serial_group_var`` (a multi-node server's group), every attempted
    host of their groups: a server whose ranks run two releases serves nothing, so it goes back as one."""
    var = play.model.serial_group_var
    if not var:
        return failed
    keys = {runner.fleet.contexts[h].vars.get(var) for h in failed} - {None, ""}
    return [h for h in attempted if h in failed or runner.fleet.contexts[h].vars.get(var) in keys]


def _hooks(runner: Runner, play: Play, b: int, targets: list[str]) -> Callable[[str, list[str]], None]:
    from functools import partial

    from fleetctl.playbook.blocks import Executor

    def run(part: str, hosts: list[str]) -> None:
        items = play.rollback_hooks.get(part) or []
        going = [h for h in hosts if not runner.fleet.contexts[h].unreachable]
        if items and going:
            executor = Executor(play, partial(runner.run_task_on, play, b, targets), lambda: False,
                                lambda h: not runner.fleet.contexts[h].unreachable, runner.forgive)
            executor.run(items, going, [], cleanup=True)

    return run


def _roll_back(runner: Runner, play: Play, recorded: dict[str, str | None], targets: list[str]) -> None:
    from fleetctl.release.manage import rollback_host

    def back(ctx: HostContext) -> tuple[str, str]:
        to = recorded.get(ctx.name)
        if not to:
            return "ok", "no release recorded before this rollout: left as it is"
        claim = runner.services.claims.get(ctx.name) if runner.services.claims else None
        outcome = rollback_host(ctx, to, runner.options.rollback_timeout, runner.holder, claim=claim)
        if not outcome.ok:
            raise HostError(ctx.name, "rollback: " + "; ".join(g.detail for g in outcome.gates if not g.ok))
        status = "rolled-back" if outcome.outcome == "rolled-back" else "ok"
        return status, f"{outcome.outcome}: {outcome.from_id or '-'} -> {outcome.to_id}"

    from fleetctl.playbook.groupstep import back_in_step

    # a group's rank > 0 stops only once its rank 0 drained (a stream in flight there needs every rank)
    going, order = back_in_step(runner, play, targets, as_release(runner, play, back))
    results = runner.fleet.map(going, names=order)
    for host, res in results.items():
        status, msg = res.value if res.ok and res.value else (res.status.value, res.reason)
        if status == "rolled-back":
            runner.recap[host]["rolled_back"] += 1
        runner.emit("rollback", play=play.index, host=host, to=recorded.get(host), status=status, msg=msg)
