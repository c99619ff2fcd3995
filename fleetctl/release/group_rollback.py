"""A multi-node server rolls back as one: after each batch of a deploy, a node group (the hosts
sharing a value of the spec's ``service.node_group`` variable) with a failed node sends every node
the deploy switched back to the release it ran before. A server whose ranks run two releases serves
nothing; a deploy that left its healthy ranks on the new release would leave the group broken.

Each peer goes back as ``fleetctl rollback --to PREVIOUS`` does (through its gateways, when it is a
worker); its result gains a failed ``node group`` gate that names the failed rank, so it counts
against the failure budget and the run says why it went back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleetctl.release.gates import GateResult
from fleetctl.release.nodegroups import rank_of
from fleetctl.transport.base import HostResult, Status
from fleetctl.transport.fleet import Fleet, HostContext


def failed_groups(fleet: Fleet, results: dict[str, HostResult[Any]], var: str,
                  ok: Callable[[HostResult[Any]], bool]) -> dict[str, tuple[list[str], list[str]]]:
    """Group value -> (its failed hosts, its hosts the deploy switched), for groups with a failure."""
    groups: dict[str, list[str]] = {}
    for name in results:
        key = fleet.contexts[name].vars.get(var)
        if key not in (None, ""):
            groups.setdefault(str(key), []).append(name)
    out = {}
    for key, members in groups.items():
        failed = [h for h in members if not ok(results[h])]
        switched = [h for h in members if ok(results[h]) and _switched(results[h].value)]
        if failed and switched:
            out[key] = (failed, switched)
    return out


def _switched(value: Any) -> bool:
    return getattr(value, "outcome", None) == "deployed" and bool(getattr(value, "previous", None)) \
        and value.previous != value.release_id


def return_peers(fleet: Fleet, results: dict[str, HostResult[Any]], var: str,
                 ok: Callable[[HostResult[Any]], bool], back: Callable[[HostContext, str], Any]) -> None:
    """Every switched peer of a failed node sent back to its previous release (``back(ctx, to)``: a
    rollback result with ``ok`` and ``gates``), all at once; its deploy result records why, in place."""
    why: dict[str, str] = {}
    for key, (failed, peers) in failed_groups(fleet, results, var, ok).items():
        ranks = ", ".join(f"rank {rank_of(fleet.contexts[h].vars)} ({h})" for h in failed)
        why.update({h: f"{var}={key}: {ranks} failed" for h in peers})
    previous: dict[str, str] = {h: getattr(results[h].value, "previous", "") for h in why}
    went = fleet.map(lambda ctx: back(ctx, previous[ctx.name]), names=sorted(why))
    for host, res in went.items():
        value: Any = results[host].value
        done = res.value if res.ok else None
        if done is not None and done.ok:
            detail = f"{why[host]}; this node went back with its group to {previous[host]}"
        else:
            said = res.reason or "; ".join(f"{g.name}: {g.detail}" for g in getattr(done, "gates", []) if not g.ok)
            detail = f"{why[host]}; going back to {previous[host]} failed too: {said}"
        value.gates.append(GateResult("node group", False, detail))
        value.outcome = "rolled-back"
        value.rollback_gates = list(getattr(done, "gates", []))
        results[host] = HostResult(host, Status.OK, value=value)


def after_batch(fleet: Fleet, var: str, holder: dict[str, Any], timeout: float,
                claims: Any = None) -> Callable[[dict[str, HostResult[Any]]], None]:
    """The hook ``run_batched`` calls after each batch of a deploy of a multi-node spec."""
    from fleetctl.release.manage import rollback_host

    def ok(res: HostResult[Any]) -> bool:
        return res.ok and res.value is not None and res.value.ok

    def back(ctx: HostContext, to: str) -> Any:
        return rollback_host(ctx, to, timeout, holder, claim=claims.get(ctx.name) if claims is not None else None)

    return lambda results: return_peers(fleet, results, var, ok, back)
