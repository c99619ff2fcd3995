"""``probe symbol``: where a name is DEFINED and where it is only REFERENCED, on every host.

The host parses candidate files with ``ast`` (``fleetctl/remote/source.py``; only files whose bytes
contain every part of the name are parsed). Definitions: ``def``/``async def`` (functions and
methods), ``class``, and assignments to plain names at module or class level (an enum member is a
class-level assignment). References: calls, attribute accesses, name loads, and imports
(``from x import NAME``; ``import y as NAME`` binds the name but defines nothing, so it is listed
as a reference of kind "import alias"). ``Class.member`` narrows both to that class.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from fleetctl.errors import InputError
from fleetctl.probes.search import call_source, validate_subpath
from fleetctl.transport.base import HostResult, HostSession

if TYPE_CHECKING:
    from fleetctl.transport.fleet import Fleet


@dataclass(frozen=True)
class SymbolRequest:
    name: str
    package: str = "sglang"
    subpath: str | None = None
    venv: str | None = None

    def validate(self) -> None:
        if not self.name or not all(part.isidentifier() for part in self.name.split(".")):
            raise InputError(f"bad symbol name {self.name!r}: expected NAME or Class.member")
        validate_subpath(self.subpath)

    def params(self) -> dict[str, Any]:
        return {"mode": "symbol", "package": self.package, "subpath": self.subpath, "name": self.name}


@dataclass(frozen=True)
class Occurrence:
    path: str  # relative to the folder holding the package: sglang/srt/...
    line: int
    kind: str  # definition: class | function | method | assignment | enum member ...; reference: call | ...
    scope: str  # enclosing class/function, dotted ("" at module level)
    text: str

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Occurrence:
        return cls(d["path"], int(d["line"]), d["kind"], d["scope"], d["text"])


@dataclass(frozen=True)
class Unparsable:
    path: str
    error: str


@dataclass(frozen=True)
class SymbolHostResult:
    definitions: list[Occurrence]
    references: list[Occurrence]
    unparsable: list[Unparsable]
    package_dir: str
    python: str = ""
    python_version: str = ""
    searched_files: int = 0
    candidate_files: int = 0  # files whose bytes contain the name: the only ones parsed
    elapsed_ms: float = 0.0

    @property
    def defined(self) -> bool:
        return bool(self.definitions)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SymbolHostResult:
        return cls(
            definitions=[Occurrence.from_dict(o) for o in d["definitions"]],
            references=[Occurrence.from_dict(o) for o in d["references"]],
            unparsable=[Unparsable(u["path"], u["error"]) for u in d["unparsable"]],
            package_dir=d["package_dir"], python=d.get("python", ""), python_version=d.get("python_version", ""),
            searched_files=int(d.get("searched_files", 0)), candidate_files=int(d.get("candidate_files", 0)),
            elapsed_ms=float(d.get("elapsed_ms", 0.0)),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def symbol_host(session: HostSession, request: SymbolRequest) -> SymbolHostResult:
    return SymbolHostResult.from_dict(call_source(session, request.params(), request.venv))


def run_symbol(fleet: Fleet, request: SymbolRequest) -> dict[str, HostResult[SymbolHostResult]]:
    request.validate()
    return fleet.map(lambda ctx: symbol_host(ctx, request))


def is_found(value: SymbolHostResult) -> bool:
    """``--expect present`` holds where the symbol is DEFINED (references alone do not count);
    ``--expect absent`` where it is not defined."""
    return value.defined
