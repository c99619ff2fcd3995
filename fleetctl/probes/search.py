"""``probe grep``: search an installed package's source on every host, counts side by side.

The host does the searching (``fleetctl/remote/source.py``, run by the venv's python so the
package is found where ``import`` finds it); this module builds the request, turns each host's
answer into dataclasses, and lays the per-term counts out as a TERM x HOST matrix.

A *hit* is a matching line. ``counts[term]`` is the number of lines containing the term (like
``grep -c``), always complete; only the listing of lines is capped by ``max_hits`` per host.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from fleetctl import hostpaths
from fleetctl.errors import HostError, InputError, RemoteOperationError
from fleetctl.probes import Expect, host_venv, probe_python
from fleetctl.transport.base import HostResult, HostSession

if TYPE_CHECKING:
    from fleetctl.transport.fleet import Fleet

SOURCE_OP = "source"


@dataclass(frozen=True)
class GrepRequest:
    terms: tuple[str, ...]
    package: str = "sglang"
    subpath: str | None = None
    ignore_case: bool = False
    regex: bool = False
    max_hits: int = 200
    context: int = 0
    venv: str | None = None
    cache: bool = True  # the host keeps what a search learnt of each file for the next one (remote/grep_cache.py)

    def __post_init__(self) -> None:
        # The same term twice would only repeat a row of the matrix.
        object.__setattr__(self, "terms", tuple(dict.fromkeys(self.terms)))

    def validate(self) -> None:
        """Input errors are the same on every host: refuse them once, before connecting (exit 3)."""
        if not self.terms or any(not t for t in self.terms):
            raise InputError("grep needs at least one non-empty TERM")
        validate_subpath(self.subpath)
        if self.regex:
            for term in self.terms:
                try:
                    re.compile(term)
                except re.error as exc:
                    raise InputError(f"invalid regex {term!r}: {exc}") from None

    def params(self) -> dict[str, Any]:
        return {"mode": "grep", "package": self.package, "subpath": self.subpath, "terms": list(self.terms),
                "ignore_case": self.ignore_case, "regex": self.regex, "max_hits": self.max_hits,
                "context": self.context}


def validate_subpath(subpath: str | None) -> None:
    if subpath and (subpath.startswith("/") or ".." in subpath.split("/")):
        raise InputError(f"--subpath {subpath!r} must be a relative path inside the package")


@dataclass(frozen=True)
class Hit:
    line: int
    text: str
    terms: tuple[str, ...]


@dataclass(frozen=True)
class FileHits:
    path: str  # relative to the folder holding the package: sglang/srt/...
    lines: int  # matching lines in this file, listed or not
    counts: dict[str, int]
    hits: list[Hit]
    context: list[tuple[int, str]] = field(default_factory=list)

    @property
    def not_shown(self) -> int:
        return self.lines - len(self.hits)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FileHits:
        return cls(d["path"], int(d["lines"]), dict(d["counts"]),
                   [Hit(h["line"], h["text"], tuple(h["terms"])) for h in d["hits"]],
                   [(int(n), str(t)) for n, t in d["context"]])


class _SharedConversions:
    """A conversion of one object made once while that object lives here: the connection server
    hands hosts that matched alike one decoded list of files (transport/mux_answers.py), and a
    thousand hosts' converted copies were most of a kept ``probe grep --json``'s memory. Keyed by
    identity, the source held so its id cannot be reused; the last few only. Readers never change
    the lists (checked: the CLI's renderers, the playbook's probe module)."""

    KEEP = 8

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Any, Any]] = {}
        self._lock = threading.Lock()  # host functions convert in their threads

    def get(self, source: Any, convert: Callable[[Any], Any]) -> Any:
        with self._lock:
            found = self._seen.get(id(source))
            if found is not None and found[0] is source:
                return found[1]
            made = convert(source)
            if len(self._seen) >= self.KEEP:
                self._seen.pop(next(iter(self._seen)))
            self._seen[id(source)] = (source, made)
            return made


_SHARED = _SharedConversions()


@dataclass(frozen=True)
class GrepHostResult:
    files: list[FileHits]
    counts: dict[str, int]  # term -> matching lines on this host; complete even when truncated
    truncated: bool
    searched_files: int
    package_dir: str
    python: str
    python_version: str = ""
    matched_lines: int = 0
    shown: int = 0
    binary_files: int = 0
    unreadable_files: int = 0
    elapsed_ms: float = 0.0
    cached_files: int = 0  # not read: answered from the host's grep cache (no term, binary, or the kept lines)
    cache_note: str | None = None  # why the host's grep cache was not used or not saved

    @property
    def not_shown(self) -> int:
        return self.matched_lines - self.shown

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GrepHostResult:
        return cls(
            files=_SHARED.get(d["files"], lambda raw: [FileHits.from_dict(f) for f in raw]),
            counts=dict(d["counts"]),
            truncated=bool(d["truncated"]), searched_files=int(d["searched_files"]),
            package_dir=d["package_dir"], python=d["python"], python_version=d.get("python_version", ""),
            matched_lines=int(d["matched_lines"]), shown=int(d["shown"]),
            binary_files=int(d.get("binary_files", 0)), unreadable_files=int(d.get("unreadable_files", 0)),
            elapsed_ms=float(d.get("elapsed_ms", 0.0)), cached_files=int(d.get("cached_files") or 0),
            cache_note=d.get("cache"),
        )

    def to_dict(self) -> dict[str, Any]:
        # Field by field, not asdict: its deep copy of every hit was a tenth of a 32-host --json run.
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["files"] = _SHARED.get(self.files, lambda files: [
            {"path": f.path, "lines": f.lines, "counts": dict(f.counts),
             "hits": [{"line": h.line, "text": h.text, "terms": list(h.terms)} for h in f.hits],
             "context": [list(c) for c in f.context]} for f in files])
        out["counts"] = dict(self.counts)
        return out


def call_source(session: HostSession, params: dict[str, Any], venv: str | None) -> Any:
    """One call of the host-side module; its input errors become this host's one-line reason."""
    try:
        return session.call(SOURCE_OP, params, python=probe_python(session, venv))
    except RemoteOperationError as exc:
        if exc.etype == "ProbeInputError":
            raise HostError(session.name, exc.remote_message) from None
        if exc.etype == "InterpreterNotFound":
            where = f"venv {host_venv(session, venv)}" if host_venv(session, venv) else "the interpreter"
            raise HostError(session.name, f"{exc.remote_message}: is {where} there on this host?") from None
        raise


def grep_host(session: HostSession, request: GrepRequest) -> GrepHostResult:
    params = request.params()
    if request.cache:
        params["cache_dir"] = hostpaths.cache_dir(session.vars)
    return GrepHostResult.from_dict(call_source(session, params, request.venv))


def run_grep(fleet: Fleet, request: GrepRequest) -> dict[str, HostResult[GrepHostResult]]:
    request.validate()
    return fleet.map(lambda ctx: grep_host(ctx, request))


@dataclass(frozen=True)
class CountRow:
    """One term's counts across hosts; None for a host that did not answer."""

    term: str
    counts: dict[str, int | None]

    @property
    def missing_on(self) -> list[str]:
        return [h for h, n in self.counts.items() if n == 0]


def count_matrix(results: dict[str, HostResult[GrepHostResult]], terms: tuple[str, ...]) -> list[CountRow]:
    rows = []
    for term in terms:
        counts: dict[str, int | None] = {}
        for host, res in sorted(results.items()):
            counts[host] = res.value.counts.get(term, 0) if res.ok and res.value is not None else None
        rows.append(CountRow(term, counts))
    return rows


def expectation(expect: Expect) -> Callable[[GrepHostResult], bool]:
    """What "found" means for ``--expect``.

    present: a host passes when EVERY term matched at least one line there;
    absent: a host passes when NO term matched any line there.
    """
    if expect is Expect.PRESENT:
        return lambda v: all(v.counts.get(t, 0) > 0 for t in v.counts)
    return lambda v: any(n > 0 for n in v.counts.values())


def matrix_json(rows: list[CountRow]) -> dict[str, dict[str, int | None]]:
    return {row.term: row.counts for row in rows}
