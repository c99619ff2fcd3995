"""``probe import``: import a module with each host's venv python and report what that gave.

The import runs in a child of the agent under the venv's interpreter (never in the agent itself),
so a slow or hanging import is stopped at the timeout and a crash stays in the child. An import
that raises is an answer (``imported: false`` with the error); a missing venv or a timeout fails
that host.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from fleetctl.errors import HostError, InputError, RemoteOperationError
from fleetctl.probes import host_venv, probe_python
from fleetctl.transport.base import HostResult, HostSession
from fleetctl.transport.fleet import Fleet

DEFAULT_TIMEOUT = 60.0
SYSTEM_PYTHON = "/usr/bin/python3"  # when a host has no venv and no ansible_python_interpreter
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class ImportRequest:
    module: str
    attr: str | None = None
    venv: str | None = None
    timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def parse(cls, target: str, venv: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> ImportRequest:
        """``MODULE[:ATTR]`` with dotted names on both sides, e.g. ``pkg.mod:Class.MEMBER``."""
        module, _, attr = target.partition(":")
        if not _DOTTED.match(module) or (attr and not _DOTTED.match(attr)) or target.endswith(":"):
            raise InputError(f"{target!r}: expected MODULE[:ATTR], dotted Python names (e.g. pkg.mod:Class.NAME)")
        return cls(module, attr or None, venv, timeout)

    @property
    def target(self) -> str:
        return f"{self.module}:{self.attr}" if self.attr else self.module

    def params(self) -> dict[str, Any]:
        return {"module": self.module, "attr": self.attr}


@dataclass(frozen=True)
class Owner:
    """An installed distribution providing the module's top-level name."""

    name: str
    version: str
    metadata_dir: str | None
    owns_file: bool | None  # its RECORD lists the module's file (None: no file to check)


@dataclass(frozen=True)
class ImportAnswer:
    module: str
    attr: str | None
    python: str
    python_version: str
    imported: bool
    duration_ms: float | None
    file: str | None
    stdlib: bool
    owners: tuple[Owner, ...]
    owners_via: str | None
    error_type: str | None = None
    error: str | None = None
    error_name: str | None = None
    error_path: str | None = None
    traceback: tuple[str, ...] = ()
    attr_found: bool | None = None
    attr_type: str | None = None
    attr_repr: str | None = None
    attr_error: str | None = None

    @property
    def present(self) -> bool:
        """What ``--expect present`` asks: it imports, and the attribute (if asked) exists."""
        return self.imported and (self.attr is None or bool(self.attr_found))

    @property
    def dist(self) -> Owner | None:
        return self.owners[0] if self.owners else None

    @classmethod
    def from_remote(cls, doc: dict[str, Any]) -> ImportAnswer:
        fields: dict[str, Any] = {k: doc.get(k) for k in cls.__dataclass_fields__ if k not in ("owners", "traceback")}
        fields["stdlib"] = bool(doc.get("stdlib"))
        owners = tuple(Owner(str(o["name"]), str(o["version"]), o.get("metadata_dir"), o.get("owns_file"))
                       for o in doc.get("owners") or ())
        return cls(owners=owners, traceback=tuple(doc.get("traceback") or ()), **fields)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["present"] = self.present
        out["dist"] = self.dist.name if self.dist else None
        out["dist_version"] = self.dist.version if self.dist else None
        out["traceback"] = list(self.traceback)
        return out


def interpreter(session: HostSession, venv: str | None) -> str:
    """The venv's python; without a venv the host's ansible_python_interpreter, else /usr/bin/python3."""
    chosen = probe_python(session, venv)
    if chosen:
        return chosen
    configured = str(session.vars.get("ansible_python_interpreter") or "")
    return configured if configured.startswith("/") else SYSTEM_PYTHON


def probe_import(session: HostSession, request: ImportRequest) -> ImportAnswer:
    python = interpreter(session, request.venv)
    try:
        doc = session.call("importprobe", request.params(), python=python, timeout=request.timeout)
    except RemoteOperationError as exc:
        plain = _host_failure(session, request, python, exc)
        if plain is None:
            raise
        raise plain from exc
    return ImportAnswer.from_remote(doc)


def _host_failure(session: HostSession, request: ImportRequest, python: str,
                  exc: RemoteOperationError) -> HostError | None:
    """The agent's terse child errors, said in the user's terms."""
    if exc.etype == "InterpreterNotFound":
        venv = host_venv(session, request.venv)
        where = f"venv {venv} not found" if venv else "interpreter not found"
        return HostError(session.name, f"{where}: no python at {python}")
    if exc.etype == "TimeoutExpired":
        return HostError(session.name, f"import {request.module} did not finish within {request.timeout:g}s "
                                       "(stopped)")
    return None


def run_import(fleet: Fleet, request: ImportRequest) -> dict[str, HostResult[ImportAnswer]]:
    return fleet.map(lambda ctx: probe_import(ctx, request))
