"""``fleetctl venv create``: a venv on each host holding exactly the pinned set.

Decide, then do: the host describes itself (``remote/venv_create.py`` inspect: interpreter, uv,
the venv's installed distributions, which wheels its wheelhouse already holds by hash), a pure
plan says what must change, and only then are wheels uploaded and the installer run. A host whose
venv already matches is left alone and says so.

``--lock`` pins are installed with ``--no-deps`` (a lock is complete; resolving again could only
drift from it) and distributions the lock does not name are removed (pip, setuptools and wheel
are left alone, as ``pip freeze`` leaves them out). ``--requirements`` is handed to the installer
with dependency resolution, and only its own lines are checked for "nothing to change".
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from fleetctl import hostpaths
from fleetctl.errors import HostError, InputError
from fleetctl.lockfile import FREEZE_EXCLUDED, Pin, parse_lock, requirement_lines
from fleetctl.transport.base import HostResult
from fleetctl.transport.fleet import Fleet, HostContext

INSTALL_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Wheel:
    filename: str
    path: Path
    sha256: str
    size: int

    @property
    def project(self) -> tuple[str, str]:
        name, version, _build, _tags = parse_wheel_filename(self.filename)
        return canonicalize_name(name), str(version)


@dataclass(frozen=True)
class CreateRequest:
    venv: str
    python: str | None
    source: str  # the lock or requirements file, for messages
    pins: dict[str, Pin] | None = None  # --lock
    requirements: tuple[Requirement, ...] = ()  # --requirements
    wheels: tuple[Wheel, ...] = ()
    wheelhouse_dir: str | None = None  # None: the host's own (fleetctl_state_dir/wheelhouse)
    compile: bool = True  # False: pip --no-compile (no .pyc written at install, none in RECORD)

    @property
    def offline(self) -> bool:
        return bool(self.wheels)


def parse_requirements(path: Path) -> tuple[Requirement, ...]:
    return tuple(req for _number, _text, req in requirement_lines(path, "requirements file"))


def local_wheels(folder: Path, pins: dict[str, Pin] | None) -> tuple[Wheel, ...]:
    """The folder's wheels (only those of pinned versions, with a lock), hashed once for all hosts."""
    if not folder.is_dir():
        raise InputError(f"--wheelhouse {folder}: no such folder")
    found = []
    for path in sorted(folder.glob("*.whl")):
        try:
            name, version, _b, _t = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        pin = pins.get(canonicalize_name(name)) if pins is not None else None
        if pins is not None and not _same_version(pin, str(version)):
            continue
        digest = file_sha256(path)
        if pin is not None and pin.hashes and f"sha256:{digest}" not in pin.hashes:
            raise InputError(f"--wheelhouse {folder}: {path.name} has sha256 {digest}, not the hash "
                             f"line {pin.line} of the lock pins")
        found.append(Wheel(path.name, path, digest, path.stat().st_size))
    if not found:
        raise InputError(f"--wheelhouse {folder}: no wheel" + (" of a pinned version" if pins else ""))
    return tuple(found)


def file_sha256(path: Path) -> str:
    """Streamed: a torch wheel is nearly 1 GB."""
    h = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _same_version(pin: Pin | None, version: str) -> bool:
    return pin is not None and versions_equal(pin.version, version)


def versions_equal(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def load_request(venv: str, python: str | None, requirements: Path | None, lock: Path | None,
                 wheelhouse: Path | None, compile_bytecode: bool = True) -> CreateRequest:
    if python is not None and not re.fullmatch(r"3\.\d+", python):
        raise InputError(f"--python {python}: expected a version like 3.11")
    if not venv.startswith("/"):
        raise InputError(f"--venv {venv}: expected an absolute path")
    pins = parse_lock(lock) if lock else None
    reqs = parse_requirements(requirements) if requirements else ()
    wheels = local_wheels(wheelhouse, pins) if wheelhouse else ()
    return CreateRequest(venv.rstrip("/"), python, str(lock or requirements), pins, reqs, wheels,
                         compile=compile_bytecode)


# --- the plan (pure) -----------------------------------------------------------------------------

@dataclass(frozen=True)
class HostState:
    python: str | None
    python_version: str | None
    uv: str | None
    venv_exists: bool
    venv_version: str | None
    installed: dict[str, str]
    wheels: dict[str, str | None] = field(default_factory=dict)  # file name -> sha256 on the host


@dataclass(frozen=True)
class CreatePlan:
    installer: str  # "uv" | "pip"
    create: bool
    install: tuple[str, ...]  # requirement lines handed to the installer
    remove: tuple[str, ...]
    upload: tuple[Wheel, ...]
    no_deps: bool
    wheels: tuple[Wheel, ...] = ()  # every wheel the install may use: checked by hash on the host first

    @property
    def changes(self) -> bool:
        return self.create or bool(self.install or self.remove)


def check_state(host: str, req: CreateRequest, state: HostState) -> None:
    wanted = f"python{req.python}" if req.python else "python3"
    if state.python is None:
        raise HostError(host, f"no {wanted} on the host")
    if state.venv_exists and req.python and not (state.venv_version or "").startswith(req.python + "."):
        raise HostError(host, f"{req.venv} runs python {state.venv_version}, not {req.python}: "
                              "remove it or pick another --venv")


def lock_changes(pins: dict[str, Pin], installed: dict[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    install = tuple(f"{name}=={pin.version}" for name, pin in sorted(pins.items())
                    if not versions_equal(installed.get(name, ""), pin.version))
    remove = tuple(sorted(n for n in installed if n not in pins and n not in FREEZE_EXCLUDED))
    return install, remove


def unsatisfied(reqs: tuple[Requirement, ...], installed: dict[str, str]) -> list[Requirement]:
    out = []
    for r in reqs:
        have = installed.get(canonicalize_name(r.name))
        if have is None or (r.specifier and not r.specifier.contains(have, prereleases=True)):
            out.append(r)
    return out


def plan_create(req: CreateRequest, state: HostState) -> CreatePlan:
    installer = "uv" if state.uv else "pip"
    installed = state.installed if state.venv_exists else {}
    if req.pins is not None:
        install, remove = lock_changes(req.pins, installed)
        needed = {tuple(i.split("==", 1)) for i in install}
        wheels = [w for w in req.wheels if w.project in needed]
    else:
        install = tuple(str(r) for r in req.requirements) if unsatisfied(req.requirements, installed) else ()
        remove, wheels = (), list(req.wheels) if install else []
    upload = tuple(w for w in wheels if state.wheels.get(w.filename) != w.sha256)
    return CreatePlan(installer, not state.venv_exists, install, remove, upload, req.pins is not None, tuple(wheels))


# --- doing it ----------------------------------------------------------------------------------

@dataclass
class CreateOutcome:
    plan: CreatePlan
    python: str
    uploaded: int = 0
    uploaded_bytes: int = 0
    commands: list[dict[str, Any]] = field(default_factory=list)
    check: bool = False  # planned only (--check): nothing was uploaded, created, installed or removed

    @property
    def installer(self) -> str:
        return self.plan.installer

    def summary(self) -> str:
        p = self.plan
        if not p.changes:
            return "nothing to change"
        if self.check:
            parts = ["create the venv"] if p.create else []
            parts += [f"upload {len(p.upload)} wheel(s)"] if p.upload else []
            parts += [f"install {len(p.install)} ({', '.join(p.install)})"] if p.install else []
            parts += [f"remove {len(p.remove)} ({', '.join(p.remove)})"] if p.remove else []
            return "would " + ", ".join(parts)
        parts = ["venv created"] if p.create else []
        if p.install:
            parts.append(f"{len(p.install)} installed")
        if p.remove:
            parts.append(f"{len(p.remove)} removed ({', '.join(p.remove)})")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        return {"changed": p.changes, "summary": self.summary(), "installer": p.installer, "python": self.python,
                "created": p.create, "installed": list(p.install), "removed": list(p.remove),
                "uploaded": self.uploaded, "uploaded_bytes": self.uploaded_bytes, "commands": self.commands,
                "check": self.check, "would_upload": [w.filename for w in p.upload] if self.check else []}


def wheelhouse_of(ctx: HostContext, req: CreateRequest) -> str:
    return req.wheelhouse_dir or hostpaths.wheelhouse_dir(ctx.vars)


def inspect(ctx: HostContext, req: CreateRequest) -> HostState:
    raw = ctx.call("venv_create", {"action": "inspect", "venv": req.venv, "python": req.python,
                                   "wheelhouse": wheelhouse_of(ctx, req), "wheels": [w.filename for w in req.wheels]})
    return HostState(raw["python"], raw["python_version"], raw["uv"], raw["venv_exists"], raw["venv_version"],
                     dict(raw["installed"]), dict(raw["wheels"]))


def create_on_host(ctx: HostContext, req: CreateRequest, check: bool = False) -> CreateOutcome:
    """Inspect (read only), plan, then do; ``check``: the plan only, nothing written on the host."""
    state = inspect(ctx, req)
    check_state(ctx.name, req, state)
    plan = plan_create(req, state)
    outcome = CreateOutcome(plan, state.python_version or "?", check=check)
    if not plan.changes or check:
        return outcome
    if plan.upload:
        ctx.call("venv_create", {"action": "prepare", "wheelhouse": wheelhouse_of(ctx, req), "venv": req.venv})
        for w in plan.upload:  # straight to the final name: a cut upload fails the hash check next run
            ctx.connector.put(str(w.path), f"{wheelhouse_of(ctx, req)}/{w.filename}")
        outcome.uploaded, outcome.uploaded_bytes = len(plan.upload), sum(w.size for w in plan.upload)
    params = {"action": "apply", "venv": req.venv, "python": state.python, "create": plan.create,
              "installer": plan.installer, "uv": state.uv, "install": list(plan.install), "remove": list(plan.remove),
              "no_deps": plan.no_deps, "no_compile": not req.compile,
              "wheelhouse": wheelhouse_of(ctx, req) if req.offline else None,
              "wheels": {w.filename: w.sha256 for w in plan.wheels}}
    timeout = max(ctx.settings.command_timeout or 0, INSTALL_TIMEOUT_S)
    outcome.commands = ctx.call("venv_create", params, timeout=timeout)["commands"]
    return outcome


def run_create(fleet: Fleet, req: CreateRequest, check: bool = False) -> dict[str, HostResult[CreateOutcome]]:
    return fleet.map(lambda ctx: create_on_host(ctx, req, check))
