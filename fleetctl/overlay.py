"""``fleetctl venv overlay``: bring distributions of one host's venv into other hosts' venvs the
way an installer would, never the way ``cp -a`` does.

Decide, then do. Both sides describe themselves as data (``remote/overlay_source.py`` lists the
selected distributions with the hash of every file *as it would land* at the target path;
``remote/overlay_target.py`` lists what the target holds), and everything in between is pure:
the ABI check, the per-distribution plan (add / upgrade / downgrade / same; files to send, files
to remove, dist-info folders to replace). ``--dry-run`` stops there.

The doing is one stream per group of targets needing the same files: the source writes a
zlib-compressed tar of exactly the files whose hash differs to its exec channel, the controller
forwards each frame to every target's exec channel as it arrives, and each target lands files
while later ones are still on the wire. A stream, not a temp archive fetched and pushed over
SFTP: packing, compressing, both SSH hops, unpacking and writing overlap instead of running one
after another (on a 2-core host that is most of the difference to rsync), and nothing is left
to clean up on either side. The target applies in a crash-safe order (``overlay_target.apply``),
so running the same command again completes an interrupted overlay.

With ``--direct`` the controller still lists and plans both sides, but each target pulls its
stream from the source host itself: its agent runs ``ssh USER@SOURCE <the source's stream
command>`` (host keys checked against the target's own known_hosts, never skipped) and feeds what
comes back into the same apply; the controller only sends plans and reads answers.
"""

from __future__ import annotations

import base64
import json
import os
import posixpath
import shlex
import struct
import threading
import time
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from fleetctl import hostpaths, overlay_abi
from fleetctl.errors import HostError, InputError, RemoteOperationError
from fleetctl.overlay_abi import Interpreter
from fleetctl.transport.agent import module_source
from fleetctl.transport.base import HostResult, HostSession, Status, Stream
from fleetctl.transport.fleet import Fleet, HostContext
from fleetctl.transport.openssh import bulk_stream  # the file stream: OpenSSH moves the bytes

STREAM_MAGIC = b"\x00FLEETCTL-OVERLAY-1\n"
BEGIN, END = b"@@FLEETCTL-JSON-BEGIN@@", b"@@FLEETCTL-JSON-END@@"


# --- what each side holds ----------------------------------------------------------------------

@dataclass(frozen=True)
class SourceFile:
    rel: str  # a RECORD path: relative to site-packages
    sha256: str  # urlsafe base64, as RECORD writes it
    size: int
    relocated: bool = False


@dataclass(frozen=True)
class SourceDist:
    name: str
    version: str
    dist_info: str
    tags: tuple[str, ...]
    extensions: tuple[tuple[str, str], ...]  # (ABI tag of a compiled file, one such file)
    files: tuple[SourceFile, ...]  # empty until fetched: only distributions some target lacks need them
    missing: tuple[str, ...] = ()
    tree: str = ""  # one hash over every (path, digest): equal trees, nothing to compare file by file
    count: int = 0
    outside: tuple[str, ...] = ()  # RECORD paths leaving the venv (.., absolute, a symlink out): refused

    def is_meta(self, rel: str) -> bool:
        return rel.split("/", 1)[0].endswith(".dist-info")


@dataclass(frozen=True)
class SourceListing:
    host: str
    interpreter: Interpreter
    dists: dict[str, SourceDist]


@dataclass(frozen=True)
class InstalledDist:
    version: str
    dist_info: str
    files: tuple[str, ...]


@dataclass(frozen=True)
class TargetListing:
    interpreter: Interpreter
    dists: dict[str, tuple[InstalledDist, ...]]
    hashes: dict[str, str | None]
    inflight: bool = False
    matched: frozenset[str] = frozenset()  # distributions whose tree hash equals the source's


def pack(doc: Any) -> str:
    return base64.b64encode(zlib.compress(json.dumps(doc).encode(), 6)).decode()


def unpack(text: str | None) -> Any:
    return json.loads(zlib.decompress(base64.b64decode(text))) if text else None


def parse_source_dist(d: Mapping[str, Any]) -> SourceDist:
    detail = unpack(d.get("files_z")) or {"files": [], "missing": []}
    files = tuple(SourceFile(posixpath.normpath(r), sha, size, bool(moved)) for r, sha, size, moved in detail["files"])
    return SourceDist(
        canonicalize_name(d["name"]), d["version"], d["dist_info"], tuple(d.get("tags") or ()),
        tuple((t, f) for t, f in d.get("extensions") or ()), files,
        tuple(posixpath.normpath(r) for r in detail["missing"]), d.get("tree", ""), int(d.get("count", len(files))),
        tuple(d.get("outside") or ()))


def parse_source(host: str, raw: Mapping[str, Any]) -> SourceListing:
    dists = {(dist := parse_source_dist(d)).name: dist for d in raw["dists"]}
    return SourceListing(host, Interpreter.from_raw(raw["interpreter"]), dists)


def parse_target(raw: Mapping[str, Any], hashes: Mapping[str, str | None] | None = None) -> TargetListing:
    dists: dict[str, tuple[InstalledDist, ...]] = {}
    matched = set()
    for name, found in (raw.get("dists") or {}).items():
        key = canonicalize_name(name)
        dists[key] = tuple(InstalledDist(d["version"], d["dist_info"],
                                         tuple(posixpath.normpath(f) for f in unpack(d.get("files_z")) or ()))
                           for d in found)
        if len(found) == 1 and found[0].get("match"):
            matched.add(key)
    return TargetListing(Interpreter.from_raw(raw["interpreter"]), dists, dict(hashes or {}),
                         bool(raw.get("inflight")), frozenset(matched))


# --- the ABI check (pure) ------------------------------------------------------------------------

@dataclass(frozen=True)
class Refusal:
    name: str
    version: str
    reasons: tuple[str, ...]

    def line(self) -> str:
        return f"{self.name} {self.version}: " + "; ".join(self.reasons)


def compat_reasons(dist: SourceDist, target: Interpreter, source: Interpreter | None = None) -> list[str]:
    """Why this distribution's files, working under ``source``, may not be written for ``target``."""
    reasons = overlay_abi.compat_reasons(dist.tags, dist.extensions, source or target, target)
    if dist.outside:
        reasons.append(f"its RECORD names {len(dist.outside)} paths outside the venv (e.g. {dist.outside[0]}: "
                       "'..', absolute, or a symlink leaving it)")
    return reasons


def refusals(src: SourceListing, target: Interpreter) -> tuple[Refusal, ...]:
    found = []
    for dist in src.dists.values():
        reasons = compat_reasons(dist, target, src.interpreter)
        if reasons:
            found.append(Refusal(dist.name, dist.version, tuple(reasons)))
    return tuple(found)


# --- the plan (pure) -------------------------------------------------------------------------------

class Action(StrEnum):
    ADD = "add"
    UPGRADE = "upgrade"
    DOWNGRADE = "downgrade"
    SAME = "same"


def classify(old: list[str], new: str) -> Action:
    """packaging.version order; an unparsable version is only ever "same" or an upgrade."""
    if not old:
        return Action.ADD
    try:
        have, want = max(Version(v) for v in old), Version(new)
    except InvalidVersion:
        return Action.SAME if old == [new] else Action.UPGRADE
    if want == have:
        return Action.SAME
    return Action.UPGRADE if want > have else Action.DOWNGRADE


@dataclass(frozen=True)
class DistPlan:
    name: str
    action: Action
    old_version: str | None
    new_version: str
    dist_info: str
    send: tuple[str, ...]  # files whose bytes differ on the target (or are not there)
    unchanged: int
    remove: tuple[str, ...]  # listed by an old RECORD, not by the new one
    remove_dist_infos: tuple[str, ...]  # every dist-info of this name on the target now
    send_bytes: int = 0

    @property
    def changes(self) -> bool:
        return bool(self.send or self.remove or set(self.remove_dist_infos) - {self.dist_info})

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "action": self.action.value, "old_version": self.old_version,
                "new_version": self.new_version, "send": len(self.send), "send_bytes": self.send_bytes,
                "unchanged": self.unchanged, "remove": len(self.remove), "changes": self.changes}


def _under(rel: str, folders: set[str]) -> bool:
    return rel.split("/", 1)[0] in folders


def plan_dist(src: SourceDist, installed: tuple[InstalledDist, ...], hashes: Mapping[str, str | None]) -> DistPlan:
    send = [f for f in src.files if hashes.get(f.rel) != f.sha256]
    new_paths = {f.rel for f in src.files} | set(src.missing)
    dropped = {d.dist_info for d in installed} - {src.dist_info}  # removed whole, after the new files land
    remove = sorted({rel for d in installed for rel in d.files if not _under(rel, dropped)} - new_paths)
    old = sorted({d.version for d in installed})
    return DistPlan(
        src.name, classify(old, src.version), " + ".join(old) or None, src.version, src.dist_info,
        tuple(f.rel for f in send), len(src.files) - len(send), tuple(remove),
        tuple(sorted(d.dist_info for d in installed)), sum(f.size for f in send),
    )


@dataclass(frozen=True)
class HostPlan:
    host: str
    venv: str
    dists: tuple[DistPlan, ...]
    refused: tuple[Refusal, ...] = ()
    resumes: bool = False  # an earlier overlay of this venv was interrupted

    @property
    def changes(self) -> bool:
        return any(d.changes for d in self.dists)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "venv": self.venv, "changes": self.changes, "resumes": self.resumes,
                "dists": [d.to_dict() for d in self.dists],
                "refused": [{"name": r.name, "version": r.version, "reasons": list(r.reasons)} for r in self.refused]}


def plan_host(host: str, venv: str, src: SourceListing, target: TargetListing) -> HostPlan:
    """Pure: what this target needs from the source; refused whole when a distribution does not fit."""
    refused = refusals(src, target.interpreter)
    dists = []
    for name, d in sorted(src.dists.items()):
        if name in target.matched:  # the same tree hash: every file already as the source would send it
            dists.append(DistPlan(name, Action.SAME, d.version, d.version, d.dist_info, (), d.count, (),
                                  (d.dist_info,)))
        else:
            dists.append(plan_dist(d, target.dists.get(name, ()), target.hashes))
    return HostPlan(host, venv, tuple(dists), refused, target.inflight)


# --- doing it ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class OverlayRequest:
    source: str
    venv: str
    to_venv: str | None = None
    packages: tuple[str, ...] = ()
    dry_run: bool = False
    direct: bool = False  # each target pulls the stream from the source host over its own ssh
    # zlib level of the stream, 0 = none (the default, as ssh and rsync without -z): on a LAN the
    # link outruns zlib (level 1 compresses a CUDA library at ~7 MB/s on one core, tar sends 100+).
    level: int = 0
    # Only for tests of interrupted overlays: the target pauses this long after each file.
    throttle_s: float = field(default_factory=lambda: float(os.environ.get("FLEETCTL_OVERLAY_THROTTLE_S", "0")))

    @property
    def target_venv(self) -> str:
        return (self.to_venv or self.venv).rstrip("/")


@dataclass(frozen=True)
class Applied:
    written: int
    removed: int
    bytes_in: int
    seconds: float
    manifest: str
    via: str = "controller"  # "direct": the target pulled the stream from the source itself


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


def python_of(venv: str) -> str:
    return f"{venv.rstrip('/')}/bin/python"


def list_source(session: HostSession, req: OverlayRequest) -> SourceListing:
    """The source's distributions with their tree hashes; file lists come later, when needed."""
    params = {"action": "list", "packages": list(req.packages), "target_prefix": req.target_venv, "files_for": [],
              "cache_dir": hostpaths.cache_dir(session.vars)}
    try:
        raw = session.call("overlay_source", params, python=python_of(req.venv))
    except RemoteOperationError as exc:
        if exc.etype == "InterpreterNotFound":
            raise InputError(f"--from {session.name}: no venv at {req.venv}") from None
        raise
    listing = parse_source(session.name, raw)
    if not listing.dists:
        what = f" matching {', '.join(req.packages)}" if req.packages else ""
        raise InputError(f"--from {session.name}: no distribution{what} in {req.venv}")
    return listing


class SourceFiles:
    """Per-file lists of the source's distributions, fetched once, when a first target needs them."""

    def __init__(self, session: HostSession, req: OverlayRequest, listing: SourceListing) -> None:
        self.session, self.req, self.listing = session, req, listing
        self._lock = threading.Lock()
        self._fetched: set[str] = set()

    def complete(self, names: set[str]) -> SourceListing:
        with self._lock:
            missing = sorted(names - self._fetched)
            if missing:
                params = {"action": "list", "packages": missing, "target_prefix": self.req.target_venv,
                          "files_for": missing, "cache_dir": hostpaths.cache_dir(self.session.vars)}
                raw = self.session.call("overlay_source", params, python=python_of(self.req.venv))
                fresh = parse_source(self.session.name, raw).dists
                self.listing = replace(self.listing, dists={**self.listing.dists, **fresh})
                self._fetched.update(missing)
            return self.listing


def target_dirs(session: HostSession) -> dict[str, str]:
    """Where a target keeps its hash cache and its overlay journal and manifests (host vars)."""
    return {"cache_dir": hostpaths.cache_dir(session.vars), "state_dir": hostpaths.overlays_dir(session.vars)}


def target_call(session: HostSession, req: OverlayRequest, params: dict[str, Any]) -> Any:
    try:
        return session.call("overlay_target", {**params, **target_dirs(session)}, python=python_of(req.target_venv))
    except RemoteOperationError as exc:
        if exc.etype == "InterpreterNotFound":
            raise HostError(session.name, f"no venv at {req.target_venv} (create it: fleetctl venv create)") from None
        raise


def own_trees(session: HostSession, req: OverlayRequest) -> dict[str, Any]:
    """The target's own tree hash of each of its distributions (the source's globs), listed while
    the source lists: a re-run with nothing changed then costs the slower listing, not both."""
    return target_call(session, req, {"action": "list", "own_trees": True, "packages": list(req.packages)})


def matched_by_tree(src: SourceListing, own: Mapping[str, Any]) -> set[str]:
    """Distributions installed once on the target, as the source's dist-info, with the source's tree."""
    found: dict[str, Any] = {canonicalize_name(n): items for n, items in (own.get("dists") or {}).items()}
    return {name for name, d in src.dists.items()
            if len(found.get(name, ())) == 1 and found[name][0]["dist_info"] == d.dist_info
            and d.tree and found[name][0].get("tree") == d.tree}


def list_target(session: HostSession, files: SourceFiles, req: OverlayRequest,
                own: Mapping[str, Any] | None = None) -> HostPlan:
    """What this target needs. With ``own`` (its own trees, listed beside the source) only the
    distributions whose trees differ are listed again, with their files."""
    src = files.listing
    matched = matched_by_tree(src, own) if own is not None else set()
    if own is not None and matched == set(src.dists):
        target = TargetListing(Interpreter.from_raw(own["interpreter"]), {}, {}, bool(own.get("inflight")),
                               frozenset(matched))
        return plan_host(session.name, req.target_venv, src, target)
    rest = sorted(set(src.dists) - matched)
    raw = target_call(session, req, {"action": "list", "names": rest,
                                     "trees": {n: [src.dists[n].dist_info, src.dists[n].tree] for n in rest}})
    target = parse_target(raw)
    target = replace(target, matched=target.matched | matched)
    unmatched = set(src.dists) - target.matched
    if unmatched:
        src = files.complete(unmatched)
        paths = sorted({f.rel for n in unmatched for f in src.dists[n].files})
        found = target_call(session, req, {"action": "hashes", "paths_z": pack(paths)})
        target = replace(target, hashes=unpack(found["hashes_z"]))
    return plan_host(session.name, req.target_venv, src, target)


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
    """List both sides, plan every target (pure), then stream to the targets that need it."""
    with ThreadPoolExecutor(1) as pool:  # the targets list their own trees while the source lists
        listed = pool.submit(list_source, source, req)
        own = targets.map(lambda ctx: own_trees(ctx, req))
        files = SourceFiles(source, req, listed.result())

    def plan(ctx: HostContext) -> HostPlan:  # a target whose own listing failed is asked the old way
        first = own.get(ctx.name)
        return list_target(ctx, files, req, first.value if first is not None and first.ok else None)

    results = {h: judged(r) for h, r in targets.map(plan).items()}
    src = files.listing
    report = OverlayReport(req, src, results)
    if req.dry_run:
        return report
    groups: dict[tuple[str, ...], list[HostContext]] = {}
    for host, res in results.items():
        if res.ok and res.value is not None and res.value.plan.changes:
            # --direct: every target pulls its own stream, all at once
            key = () if req.direct else tuple(rel for d in res.value.plan.dists for rel in d.send)
            groups.setdefault(key, []).append(targets.contexts[host])
    for members in groups.values():
        plans = {c.name: _plan(results, c.name) for c in members}
        for host, outcome in stream_group(source, members, src, plans, req).items():
            results[host] = _applied(results[host], outcome)
    return report


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


# --- the stream ------------------------------------------------------------------------------------

def stream_command(module: str, python: str) -> str:
    """Run a remote module's ``stream_main`` under ``python``, its source inline (as the agent is)."""
    source, _ = module_source(module)
    blob = base64.b64encode(zlib.compress(source.encode(), 9)).decode()
    code = f"import zlib,base64;exec(zlib.decompress(base64.b64decode('{blob}')))"
    return f"exec {shlex.quote(python)} -c {shlex.quote(code)}"


DIRECT_KEY_VAR = "direct_ssh_key"  # host var: the key file on the target for reaching the source


def direct_argv(source: HostContext, target: HostContext, command: str) -> list[str]:
    """The ssh the target runs to reach the source (the source's inventory connection settings);
    host keys are checked against the target's own known_hosts, never skipped."""
    spec = source.host.connection
    if spec.kind != "ssh":
        raise HostError(target.name, f"--direct: {source.name} is not reached over ssh (connection {spec.kind})")
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={max(1, int(spec.connect_timeout))}"]
    key = target.vars.get(DIRECT_KEY_VAR)
    if key is not None:
        if not isinstance(key, str) or not key:
            raise HostError(target.name, f"{DIRECT_KEY_VAR} must be a path on {target.name}")
        argv += ["-o", "IdentitiesOnly=yes", "-i", key]
    if spec.jump:
        argv += ["-J", spec.jump]
    argv += ["-p", str(spec.port), "--", f"{spec.user}@{spec.hostname}" if spec.user else spec.hostname, command]
    return argv


def direct_failure(host: str, source: str, why: str) -> str:
    """One line for a target that could not reach the source itself."""
    if "host key" in why.lower():
        hint = f"pin {source}'s key in {host}'s ~/.ssh/known_hosts"
    elif "permission denied" in why.lower() or "identity file" in why.lower():
        hint = f"give {host} a key that {source} accepts (host var {DIRECT_KEY_VAR})"
    else:
        hint = f"check that {host} can reach {source} over ssh"
    return f"{host} cannot reach {source} directly: {why}; {hint} or drop --direct"


def frame(doc: Any) -> bytes:
    data = json.dumps(doc).encode()
    return struct.pack(">I", len(data)) + data


def send_order(src: SourceListing, plan: HostPlan) -> list[list[str]]:
    """Package files first, then each dist-info with RECORD last: the target writes those last."""
    body: list[list[str]] = []
    meta: list[list[str]] = []
    for d in plan.dists:
        info = src.dists[d.name]
        for rel in d.send:
            (meta if info.is_meta(rel) else body).append([d.dist_info, rel])
    meta.sort(key=lambda item: (item[0], item[1].endswith("/RECORD"), item[1]))
    return body + meta


def target_params(src: SourceListing, plan: HostPlan, req: OverlayRequest) -> dict[str, Any]:
    changed = [d for d in plan.dists if d.changes]
    manifest = {
        "schema": 1, "source_host": src.host, "source_venv": req.venv.rstrip("/"), "target_venv": req.target_venv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dists": [{"name": d.name, "version": d.new_version, "old_version": d.old_version, "action": d.action.value,
                   "dist_info": d.dist_info, "files": {f.rel: f.sha256 for f in src.dists[d.name].files}}
                  for d in changed],
    }
    return {
        "expect": [rel for d in changed for rel in d.send], "remove": [rel for d in changed for rel in d.remove],
        "remove_dist_infos": [i for d in changed for i in d.remove_dist_infos],
        "new_dist_infos": {d.dist_info: [f.rel for f in src.dists[d.name].files if f.rel.startswith(d.dist_info + "/")]
                           for d in changed},
        "manifest": manifest, "throttle_s": req.throttle_s, "level": req.level,
    }


class Reader:
    """Exact reads from a Stream, with a deadline per read."""

    def __init__(self, stream: Stream, timeout: float | None) -> None:
        self.stream, self.timeout, self.buf = stream, timeout, bytearray()

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.stream.recv(max(n - len(self.buf), 1 << 16), self.timeout)
            if not chunk:
                raise EOFError("the stream ended early")
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def until(self, marker: bytes, limit: int = 1 << 16) -> bytes:
        while marker not in self.buf:
            if len(self.buf) > limit + len(marker):
                raise EOFError(f"no {marker!r} within {limit} bytes")
            chunk = self.stream.recv(1 << 16, self.timeout)
            if not chunk:
                raise EOFError("the stream ended early")
            self.buf += chunk
        head, _, rest = bytes(self.buf).partition(marker)
        self.buf = bytearray(rest)
        return head


def _why(stream: Stream, exc: BaseException) -> str:
    tail = stream.stderr_tail().strip()
    return f"{type(exc).__name__}: {exc}" + (f" ({tail})" if tail else "")


def source_params(src: SourceListing, plan: HostPlan, req: OverlayRequest) -> dict[str, Any]:
    """What the source's stream_main reads: the files to send, in the order the target writes them."""
    return {"send": send_order(src, plan), "target_prefix": req.target_venv, "level": req.level}


def open_targets(members: list[HostContext], src: SourceListing, plans: Mapping[str, HostPlan],
                 req: OverlayRequest, direct_from: HostContext | None = None
                 ) -> tuple[dict[str, Stream], dict[str, Applied | str]]:
    sinks: dict[str, Stream] = {}
    failed: dict[str, Applied | str] = {}
    for ctx in members:
        try:
            params = {**target_params(src, plans[ctx.name], req), **target_dirs(ctx)}
            if direct_from is not None:  # the target runs the source's stream command itself
                command = stream_command("overlay_source", python_of(req.venv))
                params["direct"] = {"argv": direct_argv(direct_from, ctx, command),
                                    "params": source_params(src, plans[ctx.name], req)}
            stream = bulk_stream(ctx.connector, stream_command("overlay_target", python_of(req.target_venv)))
            stream.send(frame(params))
            sinks[ctx.name] = stream
        except HostError as exc:
            failed[ctx.name] = f"cannot start the overlay: {exc.reason}"
        except Exception as exc:  # one target that cannot be reached must not stop the others
            failed[ctx.name] = f"cannot start the overlay: {type(exc).__name__}: {exc}"
    return sinks, failed


def pump(source: Stream, sinks: dict[str, Stream], failed: dict[str, Applied | str], timeout: float | None) -> None:
    """Forward the source's frames to every live target; a target that drops is marked and left."""
    reader = Reader(source, timeout)
    reader.until(STREAM_MAGIC)
    while sinks:
        size = struct.unpack(">I", reader.exact(4))[0]
        if size == 0:
            return
        chunk = reader.exact(size)
        for host, sink in list(sinks.items()):
            try:
                sink.send(chunk)
            except Exception as exc:
                failed[host] = send_failed(sink, exc)
                sink.close()
                del sinks[host]


class Lost(str):
    """An outcome: the target's SSH connection went away (the host is unreachable)."""


def _lost(sink: Stream) -> bool:
    check = getattr(sink, "connection_lost", None)
    return bool(check is not None and check())


def send_failed(sink: Stream, exc: BaseException) -> Applied | str:
    """A target stopped taking the stream: its own answer when it gave one (it failed and said why,
    e.g. its disk is full), else the lost connection."""
    if _lost(sink):
        return Lost(f"connection lost during the transfer: {_why(sink, exc)}")
    answer = collect(sink, 10.0)
    if isinstance(answer, str) and answer.startswith("no answer from the target"):
        return f"connection lost during the transfer: {_why(sink, exc)}"
    return answer


def collect(sink: Stream, timeout: float | None, host: str = "", direct_from: str | None = None) -> Applied | str:
    reader = Reader(sink, timeout)
    try:
        reader.until(BEGIN, limit=1 << 20)
        answer = json.loads(reader.until(END))
    except Exception as exc:
        if _lost(sink):
            return Lost(f"connection lost during the transfer: {_why(sink, exc)}")
        return f"no answer from the target: {_why(sink, exc)}"
    if not answer.get("ok"):
        if direct_from is not None and answer.get("unreachable"):
            return direct_failure(host, direct_from, answer["unreachable"])
        if answer.get("not_permitted"):  # refused before any change: the host's one line
            return str(answer.get("error"))
        return f"overlay failed on the target: {answer.get('error')}"
    r = answer["result"]
    return Applied(r["written"], r["removed"], r["bytes_in"], r["seconds"], r["manifest"],
                   "direct" if direct_from is not None else "controller")


def stream_group(source: HostContext, members: list[HostContext], src: SourceListing,
                 plans: Mapping[str, HostPlan], req: OverlayRequest) -> dict[str, Applied | str]:
    """One source stream, forwarded to every target of the group; each target's outcome. With
    ``--direct`` each target pulls its own stream from the source, all at once."""
    timeout = source.settings.command_timeout
    if req.direct:
        sinks, outcomes = open_targets(members, src, plans, req, direct_from=source)
        for host, sink in sinks.items():
            outcomes[host] = collect(sink, timeout, host, source.name)
            sink.close()
        return outcomes
    sinks, outcomes = open_targets(members, src, plans, req)
    if not sinks:
        return outcomes
    pipe: Stream | None = None
    try:
        pipe = bulk_stream(source.connector, stream_command("overlay_source", python_of(req.venv)))
        pipe.send(frame(source_params(src, plans[next(iter(sinks))], req)))
        pump(pipe, sinks, outcomes, timeout)
    except Exception as exc:  # the source failed: no target may finish a partial stream
        why = _why(pipe, exc) if pipe is not None else f"{type(exc).__name__}: {exc}"
        for host, sink in sinks.items():
            outcomes[host] = f"the source {source.name} failed during the transfer: {why}"
            sink.close()
        return outcomes
    finally:
        if pipe is not None:
            pipe.close()
    for host, sink in sinks.items():
        outcomes[host] = collect(sink, timeout)
        sink.close()
    return outcomes


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
