"""``fleetctl venv overlay``: bring distributions of one host's venv into other hosts' venvs the
way an installer would, never the way ``cp -a`` does.

Decide, then do. Both sides describe themselves as data (``remote/overlay_source.py`` lists the
selected distributions with the hash of every file *as it would land* at the target path;
``remote/overlay_target.py`` lists what the target holds); everything in between is pure
(``overlay_plan.py``: the ABI check, the per-distribution plan). ``--dry-run`` stops there. This
module lists both sides, plans every target and runs the groups.

The doing (``overlay_stream.py``) is one stream per group of targets needing the same files: the
source writes exactly the files whose hash differs to its stream, the controller forwards each
frame to every target's stream as it arrives, and each target lands files while later ones are
still on the wire. A stream, not a temp archive fetched and pushed over SFTP: reading, both SSH
hops and writing overlap instead of running one after another, and nothing is left to clean up
on either side. The target applies in a crash-safe order (``overlay_target.apply``), so running
the same command again completes an interrupted overlay.

With ``--direct`` the controller still lists and plans both sides, but each target pulls its
stream from the source host itself: its agent runs ``ssh USER@SOURCE <the source's stream
command>`` (host keys checked against the target's own known_hosts, never skipped) and feeds what
comes back into the same apply; the controller only sends plans and reads answers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from packaging.utils import canonicalize_name

from fleetctl import hostpaths
from fleetctl.errors import HostError, InputError, RemoteOperationError
from fleetctl.overlay.abi import Interpreter
from fleetctl.overlay.calls import HostCalls, as_calls, open_calls
from fleetctl.overlay.plan import (
    HostPlan,
    OverlayRequest,
    SourceListing,
    TargetListing,
    pack,
    parse_source,
    parse_target,
    plan_host,
    unpack,
)
from fleetctl.overlay.stream import Applied, Lost, python_of, stream_group, target_dirs
from fleetctl.transport.base import HostResult, HostSession, Status
from fleetctl.transport.fleet import Fleet, HostContext

T = TypeVar("T")

# --- doing it ----------------------------------------------------------------------------------

@dataclass
class HostOverlay:
    plan: HostPlan
    applied: Applied | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "applied": None if self.applied is None else self.applied.__dict__}


@dataclass
class OverlayReport:
    request: OverlayRequest
    source: SourceListing
    results: dict[str, HostResult[HostOverlay]]

    def summary(self) -> str:
        ok = [r for r in self.results.values() if r.ok]
        changed = sum(1 for r in ok if r.value and r.value.plan.changes)
        verb = "would change" if self.request.dry_run else "changed"
        line = f"{len(self.results)} targets: {changed} {verb}, {len(ok) - changed} nothing to change"
        bad = sorted(h for h, r in self.results.items() if not r.ok)
        return line + (f", {len(bad)} failed ({', '.join(bad)})" if bad else "")


def list_source(host: HostCalls | HostSession, req: OverlayRequest) -> SourceListing:
    """The source's distributions with their tree hashes; file lists come later, when needed."""
    calls = as_calls(host, "overlay_source", python_of(req.venv))
    params = {"action": "list", "packages": list(req.packages), "target_prefix": req.target_venv, "files_for": [],
              "cache_dir": hostpaths.cache_dir(calls.ctx.vars)}
    try:
        raw = calls.call(params)
    except RemoteOperationError as exc:
        if exc.etype == "InterpreterNotFound":
            raise InputError(f"--from {calls.name}: no venv at {req.venv}") from None
        raise
    listing = parse_source(calls.name, raw)
    if not listing.dists:
        what = f" matching {', '.join(req.packages)}" if req.packages else ""
        raise InputError(f"--from {calls.name}: no distribution{what} in {req.venv}")
    return listing


class SourceFiles:
    """Per-file lists of the source's distributions, fetched once, when a first target needs them
    (from a stream process: what it described for the listing, not described again)."""

    def __init__(self, host: HostCalls | HostSession, req: OverlayRequest, listing: SourceListing) -> None:
        self.calls = as_calls(host, "overlay_source", python_of(req.venv))
        self.req, self.listing = req, listing
        self._lock = threading.Lock()
        self._fetched: set[str] = set()

    def complete(self, names: set[str]) -> SourceListing:
        with self._lock:
            missing = sorted(names - self._fetched)
            if missing:
                params = {"action": "list", "packages": missing, "target_prefix": self.req.target_venv,
                          "files_for": missing, "cache_dir": hostpaths.cache_dir(self.calls.ctx.vars)}
                fresh = parse_source(self.calls.name, self.calls.call(params)).dists
                self.listing = replace(self.listing, dists={**self.listing.dists, **fresh})
                self._fetched.update(missing)
            return self.listing


def target_call(host: HostCalls | HostSession, req: OverlayRequest, params: dict[str, Any]) -> Any:
    calls = as_calls(host, "overlay_target", python_of(req.target_venv))
    try:
        return calls.call({**params, **target_dirs(calls.ctx)})
    except RemoteOperationError as exc:
        if exc.etype == "InterpreterNotFound":
            raise HostError(calls.name, f"no venv at {req.target_venv} (create it: fleetctl venv create)") from None
        raise


def own_trees(calls: HostCalls, req: OverlayRequest) -> dict[str, Any]:
    """The target's own tree hash of each of its distributions (the source's globs), listed while
    the source lists: a re-run with nothing changed then costs the slower listing, not both."""
    return target_call(calls, req, {"action": "list", "own_trees": True, "packages": list(req.packages)})


def matched_by_tree(src: SourceListing, own: Mapping[str, Any]) -> set[str]:
    """Distributions installed once on the target, as the source's dist-info, with the source's tree."""
    found: dict[str, Any] = {canonicalize_name(n): items for n, items in (own.get("dists") or {}).items()}
    return {name for name, d in src.dists.items()
            if len(found.get(name, ())) == 1 and found[name][0]["dist_info"] == d.dist_info
            and d.tree and found[name][0].get("tree") == d.tree}


def own_listing(own: Mapping[str, Any], matched: set[str]) -> TargetListing:
    """The target as its own tree listing describes it: no file lists (none needed)."""
    return TargetListing(Interpreter.from_raw(own["interpreter"]), {}, {}, bool(own.get("inflight")),
                         frozenset(matched))


def list_target(host: HostCalls | HostSession, files: SourceFiles, req: OverlayRequest,
                own: Mapping[str, Any] | None = None) -> HostPlan:
    """What this target needs. With ``own`` (its own trees, listed beside the source) only the
    distributions whose trees differ are listed again, with their files."""
    calls = as_calls(host, "overlay_target", python_of(req.target_venv))
    src = files.listing
    matched = matched_by_tree(src, own) if own is not None else set()
    rest = sorted(set(src.dists) - matched)
    if own is not None and not rest:
        return plan_host(calls.name, req.target_venv, src, own_listing(own, matched))
    # None of them installed here, and no overlay of this venv cut short: nothing to compare file by
    # file (a stray file already there with the same bytes is sent again, its end state the same).
    fresh = own is not None and not own.get("inflight") and not {
        canonicalize_name(n) for n in own.get("dists") or {}} & set(rest)
    if fresh:
        assert own is not None
        target = own_listing(own, matched)
    else:
        raw = target_call(calls, req, {"action": "list", "names": rest,
                                       "trees": {n: [src.dists[n].dist_info, src.dists[n].tree] for n in rest}})
        target = parse_target(raw)
        target = replace(target, matched=target.matched | matched)
    unmatched = set(src.dists) - target.matched
    if unmatched:
        src = files.complete(unmatched)
    if unmatched and not fresh:
        paths = sorted({f.rel for n in unmatched for f in src.dists[n].files})
        found = target_call(calls, req, {"action": "hashes", "paths_z": pack(paths)})
        target = replace(target, hashes=unpack(found["hashes_z"]))
    return plan_host(calls.name, req.target_venv, src, target)


def judged(res: HostResult[HostPlan]) -> HostResult[HostOverlay]:
    """A refused plan is a failed host that still shows its plan and the offending distributions."""
    if not res.ok or res.value is None:
        return HostResult(res.host, res.status, reason=res.reason, details=res.details)
    plan = res.value
    if plan.refused:
        why = "refused, nothing written: " + " | ".join(r.line() for r in plan.refused)
        return HostResult(res.host, Status.FAILED, value=HostOverlay(plan), reason=why)
    return HostResult(res.host, Status.OK, value=HostOverlay(plan))


def run_overlay(source: HostContext, targets: Fleet, req: OverlayRequest) -> OverlayReport:
    """List both sides, plan every target (pure), then stream to the targets that need it. Each
    host's listing calls run on the process that then takes its plan or sends its files."""
    opened: dict[str, HostCalls] = {}

    def calls_of(ctx: HostContext, module: str, venv: str) -> HostCalls:
        if ctx.name not in opened:
            opened[ctx.name] = open_calls(ctx, module, python_of(venv))
        return opened[ctx.name]

    try:
        with ThreadPoolExecutor(1) as pool:  # the targets list their own trees while the source lists
            listed = pool.submit(lambda: list_source(calls_of(source, "overlay_source", req.venv), req))
            own = each_target(targets, lambda ctx: own_trees(calls_of(ctx, "overlay_target", req.target_venv), req))
            described = listed.result()  # first: the source's own error, and its process is in `opened` after it
            files = SourceFiles(opened[source.name], req, described)

        def plan(ctx: HostContext) -> HostPlan:  # a target whose own listing failed is asked the old way
            first = own.get(ctx.name)
            calls = calls_of(ctx, "overlay_target", req.target_venv)
            return list_target(calls, files, req, first.value if first is not None and first.ok else None)

        results = {h: judged(r) for h, r in each_target(targets, plan).items()}
        for host, res in results.items():  # nothing to send there: its process ends now
            if host in opened and not (res.ok and res.value is not None and res.value.plan.changes):
                opened.pop(host).close()
        report = OverlayReport(req, files.listing, results)
        if not req.dry_run:
            apply_plans(source, targets, report, opened)
        return report
    finally:
        for calls in opened.values():
            calls.close()


def each_target(targets: Fleet, fn: Callable[[HostContext], T]) -> dict[str, HostResult[T]]:
    """``fn`` on every target, in this process's threads: the stream processes it opens stay here
    (worker processes would take them with them); over kept connections the fleet's own way."""
    if targets.settings.persist > 0:
        return targets.map(fn)
    return targets.map_threads(fn, sorted(targets.contexts))


def apply_plans(source: HostContext, targets: Fleet, report: OverlayReport,
                opened: Mapping[str, HostCalls] | None = None) -> None:
    """One stream per group of targets needing the same files; each target's outcome into the report."""
    req, src, results = report.request, report.source, report.results
    groups: dict[tuple[str, ...], list[HostContext]] = {}
    for host, res in results.items():
        if res.ok and res.value is not None and res.value.plan.changes:
            # --direct: every target pulls its own stream, all at once
            key = () if req.direct else tuple(rel for d in res.value.plan.dists for rel in d.send)
            groups.setdefault(key, []).append(targets.contexts[host])
    for members in groups.values():
        plans = {c.name: _plan(results, c.name) for c in members}
        for host, outcome in stream_group(source, members, src, plans, req, opened).items():
            results[host] = _applied(results[host], outcome)


def _plan(results: Mapping[str, HostResult[HostOverlay]], host: str) -> HostPlan:
    value = results[host].value
    assert value is not None
    return value.plan


def _applied(res: HostResult[HostOverlay], outcome: Applied | str) -> HostResult[HostOverlay]:
    assert res.value is not None
    if isinstance(outcome, Applied):
        res.value.applied = outcome
        return res
    status = Status.UNREACHABLE if isinstance(outcome, Lost) else Status.FAILED
    return HostResult(res.host, status, value=res.value, reason=str(outcome))


# --- for people --------------------------------------------------------------------------------

def host_result_text(res: HostResult[HostOverlay], dry_run: bool) -> str:
    value = res.value
    if value is None or not res.ok:
        return f"{res.status.value}: {res.reason}"
    if not value.plan.changes:
        return "nothing to change"
    if value.applied is None:
        return "would change" if dry_run else "not applied"
    a = value.applied
    how = " (direct from the source)" if a.via == "direct" else ""
    return f"done{how}: {a.written} written, {a.removed} removed, {a.bytes_in:,} B in, {a.seconds:.1f}s on the host"


def plan_rows(report: OverlayReport) -> list[list[str]]:
    """One row per host and distribution that changes (or is refused); a host with nothing to
    change gets one row saying so."""
    rows = []
    for host, res in report.results.items():
        plan = res.value.plan if res.value else None
        refused = {r.name for r in plan.refused} if plan else set()
        shown = [d for d in plan.dists if d.changes or d.name in refused] if plan else []
        for i, d in enumerate(shown):
            rows.append([host if i == 0 else "", d.name, "refused" if d.name in refused else d.action.value,
                         d.old_version or "-", d.new_version, str(len(d.send)), f"{d.send_bytes:,}",
                         str(d.unchanged), str(len(d.remove))])
        if plan and not shown:
            rows.append([host, f"({len(plan.dists)} distributions)", "same", "", "", "0", "0",
                         str(sum(d.unchanged for d in plan.dists)), "0"])
    return rows


def outcome_lines(report: OverlayReport) -> list[str]:
    return [f"{host}: {host_result_text(res, report.request.dry_run)}" for host, res in report.results.items()
            if res.ok or res.value is not None]
