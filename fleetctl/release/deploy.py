"""Deploy a release to one host: decide (inspect, check versions, apply patches on the controller),
then do (build the release folder, switch ``current``, restart, health gates, roll back on failure).

Everything before ``build`` writes nothing on the host, so a refusal (another sglang version, a
patch that does not fit, the host locked by another run) leaves the host exactly as it was, and
``--check`` stops there with the plan and the diffs.
"""

from __future__ import annotations

import difflib
import json
import shlex
from dataclasses import replace
from typing import Any

from packaging.specifiers import SpecifierSet

from fleetctl.errors import HostError, RemoteOperationError
from fleetctl.release import gateway_steps as gateway
from fleetctl.release import identity, live_canary, reconfig, servers
from fleetctl.release import instances as insts
from fleetctl.release import patches as patchlib
from fleetctl.release import stage as stagelib
from fleetctl.release.deploy_result import DeployResult
from fleetctl.release.gates import GateResult, aborting, run_gates
from fleetctl.release.hostlock import host_lock
from fleetctl.release.kernels import ReleaseKernels, release_kernels  # fleetctl kernels: tuned MoE configs
from fleetctl.release.launch_check import LaunchCheck, check_launch_args, patched_overlay
from fleetctl.release.ownership import Claim
from fleetctl.release.servers import restart
from fleetctl.release.service import (
    STANDIN,
    STANDIN_API,
    STANDIN_NAME,
    HostLayout,
    command,
    env_file,
    layout_for,
    listen,
    stored_params,
)
from fleetctl.release.spec import PatchFile, ReleaseSpec
from fleetctl.secrets import masked
from fleetctl.transport.base import HostSession


class ReleaseRefused(HostError):
    """The release does not fit this host; nothing was changed there."""


Loaded = list[tuple[PatchFile, patchlib.PatchSet]]


def load_patches(spec: ReleaseSpec) -> Loaded:
    """Parse every patch once on the controller (a malformed or escaping patch stops here)."""
    return [(p, patchlib.load_patch(p.path)) for p in spec.patches]


def deploy_host(session: HostSession, spec: ReleaseSpec, loaded: Loaded, check: bool, holder: dict[str, Any],
                break_lock: bool = False, rebuild: bool = False, stage_only: bool = False,
                claim: Claim | None = None) -> DeployResult:
    """Deploy ``spec`` on the host; ``stage_only``: the build half only (``release/stage.py``). A host
    where this spec is staged (its base unchanged since) goes straight to the switch half. What
    happens is decided once (``plan_switch``): check mode reports that decision, the real run does it.
    ``claim``: the rollout's record of the host (``ownership.py``), checked before the switch."""
    layout = layout_for(session.vars)
    with host_lock(session, layout, holder, break_lock) as broke:
        models = models_fit(session, spec)
        staged = None if check or rebuild or stage_only else stagelib.find_staged(session, spec, layout)
        if staged is not None and staged.release_id:
            state = session.call("release_host", {"op": "state", **layout.params()})
            if state.get("current") != staged.release_id:
                result = DeployResult(session.name, staged.release_id, "planned", previous=state.get("current"),
                                      broke_lock=broke, staged=True, models=models)
                # The host's configuration as of now, not as of staging (a token rotated since).
                kernels = release_kernels(session, spec, base_venv_path(spec, layout))
                reconfig.write(session, layout, staged.release_id, host_files(session, spec, layout, kernels))
                return gateway.deploy(session, spec, layout, lambda: go_live(session, spec, layout, result, holder,
                                                                             state, claim))
        result, base, files, kernels, who_ = build_half_plan(session, spec, loaded, layout, check, rebuild)
        result.broke_lock, result.models = broke, models
        rid = result.release_id
        config = host_files(session, spec, layout, kernels)
        result.plan, result.changed = plan_switch(session, spec, layout, base["state"], rid, config)
        if check:
            planned = diffs(base, files, spec, kernels, host_vars=masked(session.vars), layout=layout)
            result.diffs = reconfig.shown(planned, result.plan, result.changed)
            result.launch = launch_args_fit(session, spec, layout, base["venv_path"],
                                            patched_overlay(base["site"], files))
            switches = result.plan != "unchanged" and not stage_only
            result.gates = gateway.deploy_plan(session, spec, layout) if switches else []
            result.gates += live_canary.planned(spec, layout)  # the metrics the gates would read
            return result
        if stage_only:
            result.staged = stagelib.find_staged(session, spec, layout).release_id == rid  # staged before
            result.build = build(session, spec, layout, base, files, kernels, rid, who_)
            result.launch = launch_args_fit(session, spec, layout, f"{layout.root}/releases/{rid}/venv",
                                            built=result.build)
            result.verified = stagelib.record_staged(session, layout, rid, spec, base["site"],
                                                     result.launch.to_dict())
            result.outcome = "staged"
            return result
        if result.plan == "reconfigure":
            result.launch = launch_args_fit(session, spec, layout, f"{layout.root}/releases/{rid}/venv")
            return gateway.deploy(session, spec, layout, lambda: reconfig.reconfigure(session, spec, layout, result,
                                                                                       config))
        if result.plan == "deploy":
            result.build = build(session, spec, layout, base, files, kernels, rid, who_)
            result.launch = launch_args_fit(session, spec, layout, f"{layout.root}/releases/{rid}/venv",
                                            built=result.build)
            return gateway.deploy(session, spec, layout, lambda: go_live(session, spec, layout, result, holder,
                                                                         base["state"], claim))
        return go_live(session, spec, layout, result, holder, base["state"], claim)

def models_fit(session: HostSession, spec: ReleaseSpec) -> list[dict[str, Any]]:
    """Every model the release needs is on the host and intact, before anything is written there: the
    quick tier, and every file changed since its last hash hashed again. Else the host is refused in one
    line naming the model and the file, ``current`` untouched."""
    if not spec.models:
        return []
    from fleetctl.models.status import check_host, refusal

    states = check_host(session, spec.models, "deploy")
    why = refusal(states)
    if why:
        raise ReleaseRefused(session.name, why)
    return [s.to_dict() for s in states]


def plan_switch(session: HostSession, spec: ReleaseSpec, layout: HostLayout, state: dict[str, Any], rid: str,
                config: dict[str, Any]) -> tuple[str, list[str]]:
    """What a deploy of ``rid`` does on this host, and the configuration files it rewrites:
    ``deploy`` (build if needed, switch, restart, gate), ``reconfigure`` (the release serves already,
    its per-host configuration differs or was never gated: rewrite, restart, gate, and on failure back
    to the configuration that served), ``unchanged`` (serving as planned: gated again)."""
    if state.get("current") != rid:
        return "deploy", []
    answer = reconfig.diff(session, layout, rid, config)
    if answer["changed"] or answer["pending"]:
        return "reconfigure", list(answer["changed"])
    if not service_running(session, spec, layout):
        return "deploy", []  # switched but not serving: the switch half again
    return "unchanged", []


def build_half_plan(session: HostSession, spec: ReleaseSpec, loaded: Loaded, layout: HostLayout, check: bool,
                    rebuild: bool) -> tuple[DeployResult, dict[str, Any], dict[str, Any], ReleaseKernels | None,
                                            str]:
    """Decide: the base (created from its lock), inspected; the patches applied in memory; the id."""
    base_venv = ensure_base(session, spec, layout, check)
    base, state = inspect(session, spec, loaded, layout, base_venv)
    files = apply_patches(session.name, loaded, base)
    who_ = identity.choose(session, layout, spec.release_id, base["site"], state.get("current"), rebuild)
    rid = who_.release_id  # the spec's id, unless the base changed under an earlier build of it
    # The release to fall back to: what runs now, unless that is this very release.
    previous = state.get("previous") if state.get("current") == rid else state.get("current")
    result = DeployResult(session.name, rid, "planned", previous=previous, rebuilt=who_.why)
    kernels = release_kernels(session, spec, base_venv)  # None: the spec names no kernels.dir
    return result, {**base, "state": state, "venv_path": base_venv}, files, kernels, who_.fingerprint


def go_live(session: HostSession, spec: ReleaseSpec, layout: HostLayout, result: DeployResult,
            holder: dict[str, Any], state: dict[str, Any], claim: Claim | None = None) -> DeployResult:
    """The switch half: switch ``current`` once, then each instance in order restarted and gated;
    any failure takes the whole host (all its instances) back to ``previous``. A host found serving
    the release (``unchanged``) is gated again; when the release never passed its gates there (a run
    cut off mid-gate: host lost, Ctrl-C), the canary compares it with the release it replaced. A
    rollout's host (``claim``) that no longer runs what the rollout recorded is not switched."""
    rid, previous = result.release_id, result.previous
    unchanged = result.plan == "unchanged"
    if claim is not None and not unchanged:
        claim.check(state, rid)  # state was read under the lock the rollout holds
    baseline = None if unchanged and rid in (state.get("passed") or []) else previous
    ours = insts.of_spec(spec)
    for n, inst in enumerate(ours):
        if not unchanged:
            if n == 0 and aborting(session):  # the run is being aborted: no new switch
                raise HostError(session.name, "a second Ctrl-C aborted the run before the switch; nothing switched")
            if n == 0:  # the switch, the old servers' stop and this restart: one step on the host
                before = servers.current_names(session, layout)
                gone = [name for name in before if name not in [i.name for i in ours]]
                failed = servers.switch_over(session, layout, rid, "deploy", holder, gone, [inst.name])
            else:
                failed = restart(session, layout, inst.name)
                failed = f"{inst.name}: {failed}" if failed and inst.name else failed
            if failed:  # not serving the new release: back, exactly as a failed gate
                result.restart_error = failed
                return roll_back_after_failure(session, spec, layout, result, holder)
        gates = run_gates(session, insts.health_of(spec, inst, session.vars), layout,
                          listen(spec, layout, inst)[1], rid, baseline, inst.name, live_later=True)
        result.gates += [g if not inst.name else replace(g, name=f"{inst.name}: {g.name}") for g in gates]
        if not all(g.ok for g in gates):
            return roll_back_after_failure(session, spec, layout, result, holder)
    live = live_canary.run(session, live_canary.live(spec, layout), baseline)  # every server gated: in rotation
    result.gates += live
    if not all(g.ok for g in live):
        return roll_back_after_failure(session, spec, layout, result, holder)
    try:
        reconfig.verdict(session, layout, rid, True)
    except RemoteOperationError as exc:  # a pass not recorded is no pass: back, as after a failed gate
        result.gates.append(GateResult("gates' pass recorded", False, exc.reason))
        return roll_back_after_failure(session, spec, layout, result, holder)
    result.outcome = "unchanged" if unchanged else "deployed"
    if claim is not None:
        claim.ours.add(rid)
    if not unchanged:  # never the release a running rollout may roll back to
        protect = claim.protected() if claim is not None else []
        pruned = session.call("release_host", {"op": "prune", **layout.params(), "keep": spec.model.keep_releases,
                                               "protect": protect})
        result.pruned, result.pruned_bases = pruned["removed"], pruned.get("bases_removed") or []
    return result


def launch_args_fit(session: HostSession, spec: ReleaseSpec, layout: HostLayout, venv: str,
                    overlay: dict[str, str] | None = None, built: dict[str, Any] | None = None) -> LaunchCheck:
    """SGLang's own parser on the release's args, in ``venv``; a rejection refuses the release
    before anything switches (``current`` is untouched). A release folder this run has just
    ``built`` for it is removed again: a refused release leaves nothing behind."""
    found = check_launch_args(session, spec, layout, venv, overlay)
    if found.refused:
        if built and built.get("built"):
            # The base stays: the same spec with its args fixed builds from it again.
            identity.remove_release(session, layout, venv.rstrip("/").rsplit("/", 2)[-2], prune_bases=False)
        raise ReleaseRefused(session.name, f"{found.detail}; nothing switched")
    return found


def base_venv_path(spec: ReleaseSpec, layout: HostLayout) -> str:
    """``adopt``'s venv, or the venv built from ``lock`` under ROOT/bases/<lock hash> (one filesystem
    with the releases, so release clones are hard links)."""
    if spec.model.base.adopt:
        return spec.model.base.adopt
    return f"{layout.root}/bases/{spec.base_lock_digest[:12]}/venv"


def ensure_base(session: HostSession, spec: ReleaseSpec, layout: HostLayout, check: bool) -> str:
    """The base venv, created from the spec's lock file when it has one (idempotent: nothing is
    installed when the host already has exactly the pins). Check mode creates nothing."""
    venv = base_venv_path(spec, layout)
    if spec.model.base.lock is None or check:
        return venv
    from fleetctl.transport.fleet import HostContext
    from fleetctl.venv_create import create_on_host, load_request

    lock = spec.path.parent / spec.model.base.lock
    house = spec.path.parent / spec.model.base.wheelhouse if spec.model.base.wheelhouse else None
    assert isinstance(session, HostContext), "base venvs are created through a fleet connection"
    create_on_host(session, load_request(venv, spec.model.base.python, None, lock, house))
    return venv


def inspect(session: HostSession, spec: ReleaseSpec, loaded: Loaded, layout: HostLayout,
            base_venv: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The base venv and the files the patches touch, read once; refuse when the release does not fit."""
    dists = sorted(set(spec.model.requires) | {p.distribution for p, _ in loaded})
    wanted = sorted({fp.path for _, ps in loaded for fp in ps.files})
    answer = session.call("release_host", {"op": "inspect", **layout.params(), "base_venv": base_venv,
                                           "dists": dists, "files": wanted})
    base = answer["base"]
    if not base or not base.get("exists"):
        how = "adopt" if spec.model.base.adopt else "lock: created on deploy, not in check mode"
        raise ReleaseRefused(session.name, f"no venv at {base_venv} (the release's base, {how})")
    for dist, wanted_spec in sorted(spec.model.requires.items()):
        found = base["dists"].get(dist)
        if found is None or not SpecifierSet(wanted_spec).contains(found, prereleases=True):
            raise ReleaseRefused(session.name, f"release {spec.release_id} needs {dist}{wanted_spec}, "
                                               f"{base_venv} has {found or 'none'}; nothing changed")
    return base, answer["state"]


def apply_patches(host: str, loaded: Loaded, base: dict[str, Any]) -> dict[str, Any]:
    """New content of every file the patches touch (None: deleted), computed on the controller."""
    current: dict[str, str | None] = dict(base["files"])
    for ref, patchset in loaded:
        found = base["dists"].get(ref.distribution) or "none"
        for fp in patchset.files:
            text = patchlib.apply(fp, current.get(fp.path), patch_file=ref.path.name, host=host,
                                  dist=ref.distribution, expected_version=ref.version, found_version=found)
            current[fp.path] = None if fp.deleted else text
    return {path: text for path, text in current.items() if text != base["files"].get(path) or text is None}


def diffs(base: dict[str, Any], files: dict[str, Any], spec: ReleaseSpec,
          kernels: ReleaseKernels | None = None, host_vars: dict[str, Any] | None = None,
          layout: HostLayout | None = None) -> dict[str, str]:
    out = {}
    for path, text in sorted(files.items()):
        old = base["files"].get(path) or ""
        out[path] = "".join(difflib.unified_diff(old.splitlines(True), (text or "").splitlines(True),
                                                 f"a/{path}", f"b/{path}"))
    for inst in insts.of_spec(spec):
        key = "service" if inst.name is None else f"service.{inst.name}"
        out[f"{key}.env"] = env_file(spec, kernels.env if kernels else None, host_vars, inst)
        if layout is not None:  # the launch command as this host renders it (its vars, secrets masked)
            shown = replace(layout, host_vars=host_vars or {})
            out[f"{key}.command"] = " ".join(shlex.quote(a) for a in command(spec, shown, inst)) + "\n"
    if kernels:  # fleetctl kernels
        out["kernels/configs"] = kernels.describe()
    return out


def host_files(session: HostSession, spec: ReleaseSpec, layout: HostLayout,
               kernels: ReleaseKernels | None) -> dict[str, Any]:
    """The release's per-host configuration as the host stores it: every server's params (command,
    port, unit), service.env (real values, 0600) and each instance's env, rendered with this host's
    vars. Deploy compares it with what the host holds: a change is applied without a new release."""
    extra = {inst.params_name: json.dumps(stored_params(spec, layout, inst), indent=1) for inst in insts.of_spec(spec)}
    record = insts.release_record(spec)
    if record is not None:  # the release's instances, in order
        extra["service.json"] = json.dumps(record, indent=1)
    kernel_env = kernels.env if kernels else None
    env_files = {inst.env_name: env_file(spec, kernel_env, session.vars, inst)
                 for inst in insts.of_spec(spec) if inst.name is not None}
    if spec.model.service.standin:
        extra[STANDIN_NAME] = STANDIN.read_text(encoding="utf-8")
        extra[STANDIN_API.name] = STANDIN_API.read_text(encoding="utf-8")
    return {"env_file": env_file(spec, kernel_env, session.vars), "env_files": env_files, "extra_files": extra,
            "service_user": spec.model.service.user}


def build(session: HostSession, spec: ReleaseSpec, layout: HostLayout, base: dict[str, Any],
          files: dict[str, Any], kernels: ReleaseKernels | None, release_id: str,
          base_fingerprint: str) -> dict[str, Any]:
    """The release folder, cloned from the base whose fingerprint the manifest records, with this
    host's configuration (``host_files``)."""
    manifest: dict[str, Any] = {"release_id": release_id, "spec_digest": spec.digest, "spec": spec.path.name,
                                "base_venv": base["path"], "patches": [str(p.path.name) for p in spec.patches],
                                "base_fingerprint": base_fingerprint}
    if kernels:  # fleetctl kernels: written under <release>/kernels/configs/, hashed into the manifest
        manifest["kernels"] = kernels.manifest()
    return dict(session.call("release_host", {
        "op": "build", **layout.params(), "release_id": release_id, "base_venv": base["path"],
        "links": spec.model.base.links,
        "site": base["site"], "files": files, **host_files(session, spec, layout, kernels),
        "manifest": manifest, "kernel_files": kernels.files if kernels else {},
    }, timeout=1800))


def service_running(session: HostSession, spec: ReleaseSpec, layout: HostLayout) -> bool:
    return servers.running(session, layout, [i.name for i in insts.of_spec(spec)])


def roll_back_after_failure(session: HostSession, spec: ReleaseSpec, layout: HostLayout, result: DeployResult,
                            holder: dict[str, Any]) -> DeployResult:
    """A gate or a restart failed: the whole host back to the release that ran before, every one of its
    instances restarted and checked again (the new release's other instances stopped). When a
    restart fails too, the service may still run the previous release (a restart that was refused
    stopped nothing): the health check after it says whether it serves."""
    ours = [i.name for i in insts.of_spec(spec)]
    what = "restart" if result.restart_error else "health gate"
    if not result.previous:
        for name in ours:
            servers.stop(session, layout, name)
        reconfig.verdict(session, layout, result.release_id, False, f"{what} failed")
        result.outcome = "failed-no-previous"
        return result
    theirs = servers.names_in(session.call("release_host", {"op": "state", **layout.params()}), result.previous)
    # A revert: the release left is recorded as rejected, never a rollback target (release_switch.py).
    again = servers.switch_over(session, layout, result.previous, f"{what} failed for {result.release_id}", holder,
                                [name for name in ours if name not in theirs], theirs, kind="revert")
    # The release returned to is known good: give it time to start even when the failed one's gate was short.
    result.rollback_gates = servers.healthy_all(session, layout, theirs, max(spec.model.health.timeout, 30.0))
    if again:
        result.rollback_gates.insert(0, GateResult("restart", False, again))
    result.outcome = "rolled-back"
    return result
