"""A multi-node server changes as one: after each batch, a node group (the hosts sharing a value of
the spec's ``service.node_group`` variable) with a failed node is put back together. A server whose
ranks run two releases serves nothing; one whose rank failed serves nothing either.

- ``deploy``: every node the deploy switched (passed, or left out of its gateway because a peer
  failed) goes back to the release it ran before, as ``fleetctl rollback --to PREVIOUS`` does;
- ``rollback``: every node the rollback switched goes back to the release it ran before the
  rollback (a rank whose rollback failed was switched back there by itself): the group stays whole
  on the release it served;
- ``service restart|stop|start``: nothing to return to; every other node of the group fails too,
  naming the failed rank (behind a gateway rank 0 stays out: ``group_sync.py``).

Each such node's result gains a failed ``node group`` gate that names the failed rank, so it counts
against the failure budget and the run says why. ``recorded_var`` finds the grouping variable for
commands that take no spec: each host's current release recorded it at deploy time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleetctl.errors import InputError
from fleetctl.release.gates import GateResult
from fleetctl.release.group_sync import GroupSync, ending, verdict
from fleetctl.release.nodegroups import rank_of
from fleetctl.transport.base import HostResult, Status
from fleetctl.transport.fleet import Fleet, HostContext

Results = dict[str, HostResult[Any]]


def ok_result(res: HostResult[Any]) -> bool:
    return res.ok and res.value is not None and res.value.ok


def _only_group(res: HostResult[Any]) -> bool:
    """Failed only because a peer did (its own gates passed)."""
    failed = [g for g in getattr(res.value, "gates", []) if not g.ok]
    return res.ok and bool(failed) and all(g.name == "node group" for g in failed)


def failed_groups(fleet: Fleet, results: Results, var: str) -> dict[str, tuple[list[str], list[str]]]:
    """Group value -> (its failed hosts, its other hosts), for groups of the batch with a failure."""
    groups: dict[str, list[str]] = {}
    for name in results:
        key = fleet.contexts[name].vars.get(var)
        if key not in (None, ""):
            groups.setdefault(str(key), []).append(name)
    out = {}
    for key, members in groups.items():
        failed = [h for h in members if not ok_result(results[h]) and not _only_group(results[h])]
        if failed:
            out[key] = (failed, [h for h in members if h not in failed])
    return out


def _why(fleet: Fleet, var: str, key: str, failed: list[str], results: Results) -> str:
    def reason(h: str) -> str:
        res = results[h]
        return (res.reason or "failed") if not res.ok else verdict(res.value)[1]

    ranks = ", ".join(f"rank {rank_of(fleet.contexts[h].vars)} ({h}) failed: {reason(h)}" for h in failed)
    return f"{var}={key}: {ranks}"


def return_peers(fleet: Fleet, results: Results, var: str, back_to: Callable[[Any], str | None],
                 back: Callable[[HostContext, str], Any]) -> None:
    """Every node of a failed group with somewhere to go back to (``back_to(value)``) sent there
    (``back(ctx, to)``: a rollback result), all at once; every other node of the group marked failed
    with the failed ranks named. Results change in place."""
    why: dict[str, str] = {}
    for key, (failed, peers) in failed_groups(fleet, results, var).items():
        line = _why(fleet, var, key, failed, results)
        why.update({h: line for h in peers})
        # a failed node is told of the others (a rank 0 fails its own /health when a rank is gone)
        why.update({h: line for h in failed if results[h].ok and (back_to(results[h].value) or len(failed) > 1)})
    target = {h: back_to(results[h].value) if results[h].ok else None for h in why}
    going = [h for h in why if target[h]]
    # in step as a batch (group_sync.py); a failed rank 0 not among them is out of its gateways already
    sync = GroupSync.for_hosts(fleet.contexts, going, leaderless_ok=True, threads=fleet.settings.forks)

    def go(ctx: HostContext) -> Any:
        ctx.node_sync = sync
        return ending(sync, ctx.name, lambda: back(ctx, str(target[ctx.name])))

    went = fleet.map(go, names=sorted(going, key=lambda h: sync.rank.get(h, 0)))
    for host, line in why.items():
        value: Any = results[host].value
        if value is None:
            continue
        if host not in went:  # the group's line first: it says why, this node's own gates follow
            at = next((i for i, g in enumerate(value.gates) if not g.ok), len(value.gates))
            value.gates.insert(at, GateResult("node group", False, f"{line}; this node's group does not serve"))
            continue
        done: Any = went[host].value if went[host].ok else None
        if done is not None and done.ok:
            detail = f"{line}; this node went back with its group to {target[host]}"
        else:
            said = went[host].reason or "; ".join(f"{g.name}: {g.detail}" for g in getattr(done, "gates", [])
                                                  if not g.ok)
            detail = f"{line}; going back to {target[host]} failed too: {said}"
        value.gates.append(GateResult("node group", False, detail))
        value.outcome = "rolled-back" if hasattr(value, "release_id") else "returned"
        value.rollback_gates = list(getattr(done, "gates", []))
        results[host] = HostResult(host, Status.OK, value=value)


def _deployed_from(value: Any) -> str | None:
    """A node the deploy switched and left there: the release it ran before."""
    if getattr(value, "outcome", None) == "deployed" and value.previous and value.previous != value.release_id:
        return str(value.previous)
    return None


def _rolled_from(value: Any) -> str | None:
    """A node the rollback switched (passed or not): the release it ran before."""
    if getattr(value, "outcome", None) == "rolled-back" and value.from_id and value.from_id != value.to_id:
        return str(value.from_id)
    return None


def _hook(fleet: Fleet, var: str, back_to: Callable[[Any], str | None], holder: dict[str, Any], timeout: float,
          claims: Any) -> Callable[[Results], None]:
    from fleetctl.release.manage import rollback_host

    def back(ctx: HostContext, to: str) -> Any:
        return rollback_host(ctx, to, timeout, holder, claim=claims.get(ctx.name) if claims is not None else None)

    return lambda results: return_peers(fleet, results, var, back_to, back)


def after_batch(fleet: Fleet, var: str, holder: dict[str, Any], timeout: float,
                claims: Any = None) -> Callable[[Results], None]:
    """The hook ``run_batched`` calls after each batch of a deploy of a multi-node spec."""
    return _hook(fleet, var, _deployed_from, holder, timeout, claims)


def after_rollback_batch(fleet: Fleet, var: str, holder: dict[str, Any], timeout: float,
                         claims: Any = None) -> Callable[[Results], None]:
    """After each batch of a rollback: a group with a failed node returns to where it was."""
    return _hook(fleet, var, _rolled_from, holder, timeout, claims)


def after_service_batch(fleet: Fleet, var: str) -> Callable[[Results], None]:
    """After each batch of ``service``: a group with a failed node fails as a whole."""
    return lambda results: return_peers(fleet, results, var, lambda value: None, lambda ctx, to: None)


def recorded_var(fleet: Fleet) -> str | None:
    """The ``service.node_group`` variable the hosts' current releases were deployed with (None: no
    multi-node release); hosts that disagree are an input error (give ``--group-by``)."""
    from fleetctl.release.service import layout_for

    answers = fleet.map(lambda ctx: ctx.call("release_host", {"op": "state", **layout_for(ctx.vars).params()}))
    found = {str((r.value.get("service") or {}).get("node_group")) for r in answers.values()
             if r.ok and r.value and (r.value.get("service") or {}).get("node_group")}
    if len(found) > 1:
        raise InputError("the hosts' current releases group nodes by different variables "
                         f"({', '.join(sorted(found))}): select one multi-node release's hosts")
    return found.pop() if found else None


def in_groups(fleet: Fleet, inventory_hosts: Any, rollout: Any,
              hook: Callable[[str], Callable[[Results], None]] | None) -> tuple[Any, Any]:
    """For a command without a spec (rollback, service): the multi-node groups the hosts' current
    releases were deployed with: their node vars, each group kept in one batch, and the after-batch
    hook ``hook(var)`` builds; (rollout, None) when no release is multi-node."""
    from dataclasses import replace

    from fleetctl.release.nodegroups import annotate

    var = recorded_var(fleet)
    if not var:
        return rollout, None
    annotate(fleet.contexts, inventory_hosts, var)
    return replace(rollout, group_var=rollout.group_var or var), hook(var) if hook else None
