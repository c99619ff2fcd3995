# Included by release_host.py (`# fleetctl-include: release_switch`): the switch of ROOT/current, the
# host's release history and what a rollback goes back to, and prune. Stdlib only, Python >= 3.8; uses
# release_host's read_json, releases_dir, current_id, op_state and relocate's write_temp, discard.
#
# STATE/state.json: {"current", "previous", "history": [switch...], "rejected": {id: why}, "passed": {id: time}}
#   a switch: {"time", "from", "to", "kind": deploy | rollback | revert, "reason", "who"}
#   rejected: a release the host left by a rollback, or by a revert after its gate or restart failed; never
#             a rollback target again (`rollback --to` still may name it), until a deploy of it passes its gates.
#   passed:   a release whose gates passed on this host (the last time it was switched to or reconfigured).
import json
import os
import time

BACK = ("rollback", "revert")  # switches that leave a release because it was judged bad


def rollback_target(state, current, existing):
    """The release a rollback returns to: the newest release this host served before ``current`` (by
    its switch history) that was never rejected and is still on the host; None when there is none."""
    rejected = state.get("rejected") or {}
    for entry in reversed(state.get("history") or []):
        for rid in (entry.get("to"), entry.get("from")):
            if rid and rid != current and rid not in rejected and rid in existing:
                return rid
    legacy = state.get("previous")  # a state.json written before the history kept kinds
    if legacy and legacy != current and legacy not in rejected and legacy in existing:
        return legacy
    return None


def rolled_back_from(state, current):
    """The release an operator's rollback left to reach ``current``, when that was the last switch into
    it (a second rollback is then a no-op); None otherwise."""
    for entry in reversed(state.get("history") or []):
        if entry.get("to") == current:
            return entry.get("from") if entry.get("kind") == "rollback" else None
    return None


def history_view(state, current, existing):
    """What op_state tells the controller about the history."""
    return {"previous": rollback_target(state, current, existing),
            "rolled_back_from": rolled_back_from(state, current),
            "rejected": sorted(state.get("rejected") or {}), "passed": sorted(state.get("passed") or {}),
            "history": (state.get("history") or [])[-20:]}


def write_state(params, state, before, after):
    """state.json written whole (temporary file; the caller renames it in place)."""
    state_path = os.path.join(params["state_dir"], "state.json")
    os.makedirs(params["state_dir"], exist_ok=True)
    data = json.dumps(state, indent=1, sort_keys=True).encode("utf-8")
    try:
        return write_temp(state_path, data, 0o644)
    except BaseException as exc:
        if disk_full(exc):
            raise DiskFull(full_message(state_path, after))
        raise


def op_switch(params):
    """Point ROOT/current at the release atomically and record the switch (and, for a rollback or a
    revert, the release it leaves as rejected) in state.json."""
    root, target_id = params["root"], params["release_id"]
    kind = params.get("kind") or "deploy"
    if read_json(os.path.join(releases_dir(params), target_id, "manifest.json")) is None:
        raise RuntimeError("release %s is not on this host (or incomplete)" % target_id)
    before = current_id(root)
    state_path = os.path.join(params["state_dir"], "state.json")
    state = read_json(state_path) or {}
    history = state.get("history", [])
    history.append({"time": time.time(), "from": before, "to": target_id, "kind": kind,
                    "reason": params.get("reason", ""), "who": params.get("who", "")})
    rejected = dict(state.get("rejected") or {})
    if kind in BACK and before and before != target_id:
        rejected[before] = "%s to %s: %s" % (kind, target_id, params.get("reason", ""))
    state.update(current=target_id, history=history[-200:], rejected=rejected)
    existing = set(os.listdir(releases_dir(params)))
    state["previous"] = rollback_target(state, target_id, existing)
    # state.json is written whole before the link moves and renamed over the old one after it: a
    # full state folder refuses the switch with nothing switched; the link and state.json never
    # disagree (a host is never half-switched).
    staged = write_state(params, state, before, "nothing switched, %s is still current" % (before or "no release"))
    link = os.path.join(root, ".current.tmp-%d" % os.getpid())
    try:
        discard(link)
        os.symlink(os.path.join("releases", target_id), link)
        os.rename(link, os.path.join(root, "current"))  # rename(2) over the old link: atomic
    except BaseException as exc:
        discard(link)
        discard(staged)
        if disk_full(exc):
            raise DiskFull(full_message(os.path.join(root, "current"), "nothing switched, %s is still current"
                                        % (before or "no release")))
        raise
    os.replace(staged, state_path)
    return {"from": before, "to": target_id, "previous": state["previous"]}


def op_verdict(params):
    """Record what the gates said of ``release_id`` on this host: passed (it is a good rollback target
    again) or rejected (never one, as a revert records)."""
    state_path = os.path.join(params["state_dir"], "state.json")
    state = read_json(state_path) or {}
    rid = params["release_id"]
    passed, rejected = dict(state.get("passed") or {}), dict(state.get("rejected") or {})
    if params.get("passed"):
        passed[rid] = time.time()
        rejected.pop(rid, None)
    else:
        rejected[rid] = params.get("reason") or "its gates failed"
        passed.pop(rid, None)
    state.update(passed=passed, rejected=rejected)
    staged = write_state(params, state, None, "the verdict on %s was not recorded" % rid)
    os.replace(staged, state_path)
    return {"release_id": rid, "passed": bool(params.get("passed"))}


def op_prune(params):
    """Keep the newest ``keep`` releases; never remove current or the rollback target. A base venv
    built from a lock goes with the last release that used it."""
    state = op_state(params)
    protect = set(filter(None, [state["current"], state["previous"]] + list(params.get("protect") or [])))
    ids = [r["id"] for r in state["releases"]]  # oldest first
    removed = []
    # The oldest unprotected ones go until ``keep`` are left: a protected old release (the rollback
    # target) must not make the host keep more than ``keep`` (it used to stop the prune at it).
    for rid in ids:
        if len(ids) - len(removed) <= int(params.get("keep", 3)):
            break
        if rid not in protect:
            shutil.rmtree(os.path.join(releases_dir(params), rid))
            removed.append(rid)
    return {"removed": removed, "bases_removed": unused_bases_removed(params["root"]) if removed else []}
