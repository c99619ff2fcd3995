"""What ``pip check`` reports for one host's venv, and the answer kept between runs.

Evaluating a full SGLang closure's 2,384 Requires-Dist lines with ``packaging`` is 0.4 s of
controller CPU per command (its parser is pure Python), and an unchanged venv gives the same
answer every time. The answer is a pure function of the host's marker environment and of every
distribution's name, version and Requires-Dist (what the host read from METADATA), so it is kept
under a sha256 of exactly those, of this module's source and of packaging's version: a changed
METADATA (another requirement, another version) is another key, never a stale answer.
Kept in ``$FLEETCTL_CACHE_DIR/drift-requirements`` (default ``~/.cache/fleetctl``), one small
file per key, the newest ``KEEP`` kept; a cache that cannot be read or written is only slower.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packaging.requirements import Requirement

KEEP = 256  # answers kept (one per distinct venv content and interpreter); older ones are removed
Problem = tuple[str, str, "str | None", str]  # (package, requirement, installed version or None, why)


def cache_dir() -> Path:
    return Path(os.environ.get("FLEETCTL_CACHE_DIR") or "~/.cache/fleetctl").expanduser() / "drift-requirements"


@functools.cache
def _code_version() -> str:
    import packaging

    return hashlib.sha256(Path(__file__).read_bytes() + packaging.__version__.encode()).hexdigest()


def requirement_key(markers: Mapping[str, str], dists: Mapping[str, Sequence[tuple[str, Iterable[str]]]]) -> str:
    """sha256 of everything ``problems`` reads: ``dists`` maps a canonical name to the
    (version, Requires-Dist lines) of each of its dist-info folders."""
    doc = [_code_version(), sorted(markers.items()),
           sorted((name, sorted((v, sorted(r)) for v, r in found)) for name, found in dists.items())]
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


def problems(markers: Mapping[str, str], dists: Mapping[str, Sequence[tuple[str, Iterable[str]]]]) -> list[Problem]:
    """Each unmet requirement, sorted by package then requirement text; from the cache when this
    very content was evaluated before."""
    key = requirement_key(markers, dists)
    path = cache_dir() / f"{key}.json"
    known = _load(path)
    if known is not None:
        return known
    found = evaluate(markers, dists)
    _store(path, found)
    return found


def evaluate(markers: Mapping[str, str], dists: Mapping[str, Sequence[tuple[str, Iterable[str]]]]) -> list[Problem]:
    env = tuple(sorted({**markers, "extra": ""}.items()))
    versions = {name: " + ".join(sorted({v for v, _ in found})) for name, found in dists.items() if found}
    out: list[Problem] = []
    for name in sorted(dists):
        for text in sorted({r for _v, reqs in dists[name] for r in reqs}):
            problem = _unsatisfied(text, env, versions)
            if problem:
                out.append((name, text, problem[0], f"{name} requires {text}: {problem[1]}"))
    return out


@functools.lru_cache(maxsize=65536)
def _requirement(text: str) -> Requirement | None:
    """Parsed once per run, not once per host: a fleet's venvs repeat the same Requires-Dist lines."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return Requirement(text)
    except InvalidRequirement:
        return None  # pip check skips what it cannot parse too


@functools.lru_cache(maxsize=65536)
def _applies(text: str, env: tuple[tuple[str, str], ...]) -> bool:
    from packaging.markers import InvalidMarker

    req = _requirement(text)
    if req is None:
        return False
    try:
        return req.marker is None or req.marker.evaluate(dict(env))
    except InvalidMarker:
        return False


def _unsatisfied(text: str, env: tuple[tuple[str, str], ...],
                 versions: Mapping[str, str]) -> tuple[str | None, str] | None:
    from packaging.utils import canonicalize_name

    req = _requirement(text)
    if req is None or not _applies(text, env):
        return None
    have = versions.get(canonicalize_name(req.name))
    if have is None:
        return None, "not installed"
    if req.specifier and not req.specifier.contains(have.split(" + ")[0], prereleases=True):
        return have, f"{have} is installed"
    return None


def _load(path: Path) -> list[Problem] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, list) or not all(
            isinstance(p, list) and len(p) == 4 and isinstance(p[0], str) and isinstance(p[1], str)
            and (p[2] is None or isinstance(p[2], str)) and isinstance(p[3], str) for p in doc):
        return None  # not what _store writes: evaluated again, and written again
    return [(p[0], p[1], p[2], p[3]) for p in doc]


def _store(path: Path, found: list[Problem]) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-{os.getpid()}-{os.urandom(4).hex()}.json"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump([list(p) for p in found], handle)
            os.replace(tmp, path)  # atomic: a concurrent run reads the old answer or this one
        except BaseException:
            os.unlink(tmp)
            raise
        kept = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in kept[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # a cache only: the next run evaluates again
