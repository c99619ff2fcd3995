"""A serving release's per-host configuration changed in place: deploy's ``reconfigured``.

A release is two things: its build (venv, patches, kernels; the release id) and its configuration on
each host (the launch command, port, unit and environment rendered with that host's variables). An
inventory change (a rotated ``HF_TOKEN``, another ``--tp``, a new ``service_port``) changes the second
only. Deploy compares what the host holds with what it would write (``plan_switch``); when they differ
it rewrites them in the release folder, restarts every server and runs the same gates as a deploy.
When a gate or a restart fails, the configuration that served comes back (the host keeps it in
``RELEASE/.config-prev/`` until the gates pass), never an older release.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fleetctl.release import instances as insts
from fleetctl.release import servers
from fleetctl.release.gates import GateResult, run_gates
from fleetctl.release.service import HostLayout, listen
from fleetctl.release.spec import ReleaseSpec
from fleetctl.transport.base import HostSession

if TYPE_CHECKING:
    from fleetctl.release.deploy_result import DeployResult

def diff(session: HostSession, layout: HostLayout, release_id: str, config: dict[str, Any]) -> dict[str, Any]:
    """The host's answer: ``changed`` (file names whose content differs) and ``pending`` (a
    reconfiguration written but never gated)."""
    return dict(session.call("release_host", {"op": "config", **layout.params(), "release_id": release_id,
                                              "mode": "diff", **config}))


def write(session: HostSession, layout: HostLayout, release_id: str, config: dict[str, Any]) -> None:
    """The configuration written into a release that does not serve yet (a staged build)."""
    session.call("release_host", {"op": "config", **layout.params(), "release_id": release_id, "mode": "write",
                                  **config})


def verdict(session: HostSession, layout: HostLayout, release_id: str, passed: bool, reason: str = "") -> None:
    session.call("release_host", {"op": "verdict", **layout.params(), "release_id": release_id, "passed": passed,
                                  "reason": reason})


def shown(planned: dict[str, str], plan: str, changed: list[str]) -> dict[str, str]:
    """What ``deploy --check`` lists as written: everything for a deploy, only the rewritten
    configuration for a reconfiguration, nothing when unchanged."""
    if plan == "deploy":
        return planned
    if plan == "unchanged":
        return {}
    # the host's file -> deploy --check's key: service[.NAME].env as is, service[.NAME].json -> .command
    keys = {name.removesuffix(".json") + ".command" if name.endswith(".json") else name for name in changed}
    return {key: text for key, text in planned.items() if key in keys} or {name: "" for name in changed}


def reconfigure(session: HostSession, spec: ReleaseSpec, layout: HostLayout, result: DeployResult,
                config: dict[str, Any]) -> DeployResult:
    """Rewrite, restart each server in order and gate it (the canary against this release as it was
    configured before); on any failure the configuration that served, restarted and checked."""
    rid = result.release_id
    session.call("release_host", {"op": "config", **layout.params(), "release_id": rid, "mode": "apply", **config})
    for inst in insts.of_spec(spec):
        failed = servers.restart(session, layout, inst.name)
        if failed:
            result.restart_error = f"{inst.name}: {failed}" if inst.name else failed
            return restore(session, spec, layout, result)
        gates = run_gates(session, insts.health_of(spec, inst, session.vars), layout,
                          listen(spec, layout, inst)[1], rid,
                          rid, inst.name)
        result.gates += [g if not inst.name else replace(g, name=f"{inst.name}: {g.name}") for g in gates]
        if not all(g.ok for g in gates):
            return restore(session, spec, layout, result)
    session.call("release_host", {"op": "config", **layout.params(), "release_id": rid, "mode": "commit"})
    verdict(session, layout, rid, True)
    result.outcome = "reconfigured"
    return result


def restore(session: HostSession, spec: ReleaseSpec, layout: HostLayout, result: DeployResult) -> DeployResult:
    """The configuration that served before, every server restarted on it and its /health checked
    (on the port that configuration names)."""
    session.call("release_host", {"op": "config", **layout.params(), "release_id": result.release_id,
                                  "mode": "restore"})
    names = [i.name for i in insts.of_spec(spec)]
    failed = [f"{n or 'sglang'}: {why}" for n in names if (why := servers.restart(session, layout, n))]
    result.rollback_gates = servers.healthy_all(session, layout, names, max(spec.model.health.timeout, 30.0))
    if failed:
        result.rollback_gates.insert(0, GateResult("restart", False, "; ".join(failed)))
    result.outcome = "config-restored"
    return result
