"""``release``: deploy a release spec (build, atomic switch, restart, health gates, automatic
rollback on the host when a gate fails), or roll back to a release already on the host."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module, once
from fleetctl.transport.base import HostSession


class ReleaseArgs(Args):
    spec: str | None = None  # a release spec file, relative to the playbook
    state: Literal["deployed", "staged", "rolled_back"] = "deployed"  # staged: built and verified, not switched
    to: str | None = None  # rolled_back: the release id (default: the host's previous release)
    timeout: float = Field(default=300.0, gt=0)  # rolled_back: seconds to wait for /health

    @model_validator(mode="after")
    def _spec_for_deploy(self) -> ReleaseArgs:
        if self.state in ("deployed", "staged") and not self.spec:
            raise ValueError(f"state {self.state} needs `spec` (a release spec file)")
        return self


def current_release(session: HostSession) -> str | None:
    """The release id ``current`` points at on the host (None: no release yet)."""
    from fleetctl.release.service import layout_for

    state = session.call("release_host", {"op": "state", **layout_for(session.vars).params()})
    current = state.get("current")
    return str(current) if current else None


@module("release", ReleaseArgs, free_form="spec")
def release(mc: ModuleContext, args: ReleaseArgs) -> TaskResult:
    """Deploy ``spec`` (check mode: the plan and the patched files' diffs, nothing written); with
    ``state: staged`` build, patch, validate and verify it without switching (a later ``deployed``
    only switches, restarts and gates); with ``state: rolled_back`` switch back to ``to`` / the
    previous release and restart."""
    if args.state == "rolled_back":
        return _rollback(mc, args)
    from fleetctl.release import deploy as core

    assert args.spec is not None
    spec, loaded = _load(mc, args.spec)
    from fleetctl.release.nodegroups import annotate

    # A multi-node server's nnodes/node_rank/dist_init_addr, as `fleetctl deploy` gives them (the
    # play's `serial_group_var` keeps the group in one batch).
    annotate({mc.host: mc.session}, mc.run.inventory.hosts, spec.model.service.node_group)
    staging = args.state == "staged"
    claim = mc.run.claims.get(mc.host) if mc.run.claims else None  # the rollout's record of the host
    result = core.deploy_host(mc.session, spec, loaded, mc.check, mc.run.holder, stage_only=staging, claim=claim)
    data: dict[str, Any] = {k: v for k, v in result.to_dict().items() if k != "diffs"}
    if staging and not mc.check:
        built = bool(result.build.get("built"))
        note = f"; {result.note}" if result.note else ""
        how = "built" if built else "already staged" if result.staged else "already built"
        return TaskResult(changed=not result.staged, data=data,
                          msg=f"staged {result.release_id} ({how}, {result.verified} files verified, not switched)"
                              f"{note}")
    if mc.check:  # deploy_host's own plan (plan_switch): what the real run then does
        action = "stage" if staging else result.plan
        changed = result.previous != spec.release_id if staging else result.plan != "unchanged"
        diff = "".join(f"--- {path}\n{text}" for path, text in result.diffs.items() if text) if mc.diff else ""
        return TaskResult(changed=changed, msg=f"would {action} {spec.release_id}{gateway_steps(result.gates)}"
                          if changed else "unchanged",
                          diff=diff, data=data)
    if result.outcome == "unchanged":
        return TaskResult(msg=f"{spec.release_id} already current and running", data=data,
                          release=spec.release_id)
    if result.outcome == "deployed":
        measured = [f"{g.name}: {g.detail}" for g in result.gates if g.numbers is not None]
        extra = gateway_steps(result.gates) + "".join(f"; {m}" for m in [*measured, result.note] if m)
        how = " from its staged build" if result.staged else ""
        return TaskResult(changed=True, msg=f"deployed {result.release_id}{how} (was {result.previous or 'none'})"
                                            f"{extra}",
                          data=data, release=spec.release_id)
    if result.outcome == "reconfigured":
        return TaskResult(changed=True, msg=f"reconfigured {result.release_id} ({', '.join(result.changed)})",
                          data=data, release=spec.release_id)
    gate = result.failed_gate()
    why = f"health gate failed: {gate.name}: {gate.detail}" if gate else result.outcome
    if result.restart_error:
        why = f"restart failed: {result.restart_error}"
    if result.outcome == "config-restored":  # the release stays; its configuration that served is back
        return TaskResult(changed=True, failed=True, data=data, release=spec.release_id,
                          msg=f"{why}; {result.release_id} back on the configuration that served")
    if result.outcome == "rolled-back":
        return TaskResult(changed=True, failed=True, rolled_back=True, data=data, release=result.previous,
                          msg=f"{why}; rolled back to {result.previous}")
    return TaskResult(changed=True, failed=True, data=data, msg=f"{why}; no previous release: service stopped")


def _load(mc: ModuleContext, spec_path: str) -> tuple[Any, Any]:
    """The spec and its parsed patches, once per run (every host of every batch shares them)."""
    from fleetctl.release import deploy as core
    from fleetctl.release.spec import load_spec

    path = mc.path(spec_path).resolve()

    def load() -> tuple[Any, Any]:
        spec = load_spec(path)
        return spec, core.load_patches(spec)

    return once(mc.run, ("release-spec", str(path)), load)


def _rollback(mc: ModuleContext, args: ReleaseArgs) -> TaskResult:
    from fleetctl.release.manage import rollback_host

    if mc.check:  # the host's own answer: the release it would go back to, or why it stays
        plan = rollback_host(mc.session, args.to, args.timeout, mc.run.holder, check=True)
        if plan.outcome != "planned":
            return TaskResult(msg=plan.note or f"{plan.to_id} already current", release=plan.to_id)
        return TaskResult(changed=True, msg=f"would roll back from {plan.from_id} to {plan.to_id}",
                          release=plan.to_id)
    out = rollback_host(mc.session, args.to, args.timeout, mc.run.holder,
                        claim=mc.run.claims.get(mc.host) if mc.run.claims else None)
    data = out.to_dict()
    if not out.ok:
        return TaskResult(changed=True, failed=True, data=data, release=out.to_id,
                          msg="rolled back but: " + "; ".join(f"{g.name}: {g.detail}" for g in out.gates if not g.ok))
    changed = out.outcome == "rolled-back"
    return TaskResult(changed=changed, data=data, release=out.to_id,
                      msg=f"{out.from_id} -> {out.to_id}{gateway_steps(out.gates)}" if changed
                      else out.note or f"{out.to_id} already current")


def gateway_steps(gates: list[Any]) -> str:
    """The gateway steps a change took (``router_url``), each "; name: detail", for the task's line."""
    return "".join(f"; {g.name}: {g.detail}" for g in gates if g.name.startswith("gateway"))
