"""``fleetctl venv overlay``, the pure half: what each side holds (as the host modules list it),
the ABI check, and the per-distribution plan (add / upgrade / downgrade / same; files to send,
files to remove, dist-info folders to replace). ``--dry-run`` stops after this; ``overlay.py``
does the listing and the doing, ``overlay_stream.py`` moves the files."""

from __future__ import annotations

import base64
import json
import os
import posixpath
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from fleetctl.overlay import abi as overlay_abi
from fleetctl.overlay.abi import Interpreter

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


# --- the request ------------------------------------------------------------------------------

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
