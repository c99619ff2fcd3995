"""Drift audit: are these hosts running the same thing, and what changed under pip's feet?

Collection is one agent round trip per host (``remote/distributions.py`` under the venv's
python, plus the GPU stack); everything else here is pure: a baseline (a host, a lock file, or
the most common version) and per-host findings, each a class of its own.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from fleetctl import hostpaths
from fleetctl.drift import requirements as drift_requirements
from fleetctl.errors import InputError, RemoteOperationError
from fleetctl.gpu.collect import gpu_from_answer, gpu_step
from fleetctl.gpu.smi import GpuFacts
from fleetctl.inventory.model import Host
from fleetctl.lockfile import FREEZE_EXCLUDED, Pin
from fleetctl.probes import probe_python
from fleetctl.transport.base import HostResult, HostSession, Step


class Kind(StrEnum):
    VERSION = "version"
    MISSING = "missing"
    EXTRA = "extra"
    DUPLICATE = "duplicate-dist-info"
    UNSATISFIED = "unsatisfied"
    MODIFIED = "modified-file"
    MISSING_FILE = "missing-file"
    ORPHAN = "orphan-file"
    FOREIGN_SHEBANG = "foreign-shebang"
    STACK = "stack"  # interpreter, ABI, driver, CUDA differ from the baseline
    PATCHED = "patched"  # changed by a fleetctl release, as recorded: information, not drift
    OVERLAY = "overlay"  # brought in by `fleetctl venv overlay` (its origin): information, not drift
    SHARED = "shared-file"  # listed by several RECORDs, one owner's copy installed: information, not drift


INFO_KINDS = frozenset({Kind.PATCHED, Kind.OVERLAY, Kind.SHARED})
FAILED_NAMED = 10  # failed hosts named in the summary line
_SEPARATORS = re.compile(r"[-_.]+")


def canonicalize_name(name: str) -> str:
    """PEP 503's normalized name, as packaging.utils.canonicalize_name gives it (without importing
    packaging's version and tag modules on every drift run)."""
    return _SEPARATORS.sub("-", name).lower()


@dataclass(frozen=True)
class Dist:
    name: str
    version: str
    dist_info: str
    installer: str | None
    origin: str | None  # editable / vcs / local / url (PEP 610), None for an index install
    requires: tuple[str, ...]
    overlay: str | None = None  # "overlay from HOST:VENV at TIME" when `venv overlay` brought it


@dataclass
class HostInventory:
    """What one host's venv holds, as the host itself reported it."""

    host: str
    venv: str | None
    python: str
    stack: dict[str, str | None]  # python, abi, platform, driver, cuda, torch-cuda, vbios, gpu and gsp firmware
    markers: dict[str, str]
    dists: dict[str, list[Dist]]
    files: dict[str, Any] | None = None

    def version(self, name: str) -> str | None:
        found = self.dists.get(name)
        return " + ".join(sorted({d.version for d in found})) if found else None


@dataclass(frozen=True)
class Finding:
    host: str
    kind: Kind
    package: str | None
    expected: str | None = None
    actual: str | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kind": self.kind.value}


@dataclass(frozen=True)
class Baseline:
    source: str  # "host lab1" | "lock requirements.lock" | "most common version"
    versions: dict[str, str]
    stack: dict[str, str | None] = field(default_factory=dict)
    host: str | None = None
    lock: bool = False


def collect(session: HostSession, venv: str | None, verify_files: bool, gpu: GpuFacts | None = None) -> HostInventory:
    """One host's distributions (and file check) from its venv, plus its GPU stack (``gpu``: the
    host's GPU facts when the caller already collected them)."""
    python = probe_python(session, venv)
    try:
        params = {"verify_files": verify_files, "cache_dir": hostpaths.cache_dir(session.vars),
                  "overlays_dir": hostpaths.overlays_dir(session.vars)}
        raw = session.call("distributions", params, python=python)
    except RemoteOperationError as exc:
        if exc.etype == "InterpreterNotFound":
            raise RemoteOperationError(session.name, "drift", exc.etype, f"no venv: {exc.remote_message}") from None
        raise
    from fleetctl.models.status import current_from_answer, current_on_host, current_step, drift_rows

    if gpu is None:  # the GPU stack and the serving release's models in one round trip to the agent
        gpu_raw, models = _in_turn(session, [gpu_step(session, health=False), current_step(session)])
        gpu, states = gpu_from_answer(session.name, gpu_raw), current_from_answer(models)
    else:
        states = current_on_host(session)
    inv = parse_inventory(session.name, venv or session.vars.get("venv"), raw, gpu)
    inv.stack.update(drift_rows(states))  # the serving release's models: revision, state
    return inv


def _in_turn(session: HostSession, steps: list[Step]) -> list[Any]:
    """Each step's result, as plain calls one after another would give them (a failure raised)."""
    done = session.sequence(steps)
    for outcome in done:
        if isinstance(outcome, Exception):
            raise outcome
    return done


def parse_inventory(host: str, venv: str | None, raw: Mapping[str, Any], gpu: GpuFacts) -> HostInventory:
    dists: dict[str, list[Dist]] = {}
    for d in raw.get("dists", []):
        origin = (d.get("direct_url") or {}).get("kind")
        dist = Dist(d["name"], d.get("version") or "?", d["dist_info"], d.get("installer"), origin,
                    tuple(d.get("requires") or ()), _overlay_text(d.get("overlay")))
        dists.setdefault(canonicalize_name(d["name"]), []).append(dist)
    stack = {
        "python": raw.get("version"), "abi": raw.get("soabi"), "platform": raw.get("platform"),
        "nvidia-driver": gpu.driver_version, "cuda (driver)": gpu.cuda_version, "torch cuda": raw.get("torch_cuda"),
        "vbios": gpu.versions("vbios_version"), "gpu firmware": gpu.versions("inforom_version"),
        "gsp firmware": gpu.versions("gsp_firmware_version"),
    }
    return HostInventory(host, venv, raw.get("python", "?"), stack, raw.get("markers") or {}, dists, raw.get("files"))


def _overlay_text(raw: Mapping[str, Any] | None) -> str | None:
    if not raw:
        return None
    return f"overlay from {raw.get('source_host')}:{raw.get('source_venv')} at {raw.get('time')}"


# --- baselines ---------------------------------------------------------------------------------

def baseline_from_host(inventories: Mapping[str, HostInventory], host: str) -> Baseline:
    if host not in inventories:
        raise InputError(f"--baseline {host}: that host is not among the hosts that answered "
                         f"({', '.join(sorted(inventories)) or 'none'})")
    inv = inventories[host]
    versions = {name: v for name in inv.dists if (v := inv.version(name)) is not None}
    return Baseline(f"host {host}", versions, dict(inv.stack), host=host)


def baseline_from_lock(pins: Mapping[str, Pin], source: str) -> Baseline:
    return Baseline(f"lock {source}", {name: pin.version for name, pin in pins.items()}, lock=True)


def baseline_by_majority(inventories: Mapping[str, HostInventory]) -> Baseline:
    """Each package's most common version (ties: the newest), among packages on at least half
    of the hosts; the same for each stack row."""
    hosts = len(inventories)
    versions: dict[str, str] = {}
    names = {n for inv in inventories.values() for n in inv.dists}
    for name in sorted(names):
        seen = Counter(v for inv in inventories.values() if (v := inv.version(name)) is not None)
        if 2 * sum(seen.values()) >= hosts:
            versions[name] = _most_common(seen)
    stack: dict[str, str | None] = {}
    rows = dict.fromkeys(row for inv in inventories.values() for row in inv.stack)  # a model row some hosts lack
    for row in rows:
        stack[row] = _most_common(Counter(inv.stack.get(row) or "-" for inv in inventories.values()))
    return Baseline("most common version", versions, {k: None if v == "-" else v for k, v in stack.items()})


def _most_common(seen: Counter[str]) -> str:
    top = max(seen.values())
    return max((v for v, n in seen.items() if n == top), key=_version_key)


def _version_key(text: str) -> tuple[int, Any]:
    from packaging.version import InvalidVersion, Version

    try:
        return (1, Version(text.split(" + ")[0]))
    except InvalidVersion:
        return (0, text)


# --- findings ----------------------------------------------------------------------------------

def selected(name: str, patterns: Iterable[str] | None) -> bool:
    pats = list(patterns or ())
    return not pats or any(fnmatch.fnmatch(name, canonicalize_name(p) if "*" not in p else p.lower()) for p in pats)


def host_findings(inv: HostInventory, base: Baseline, packages: Iterable[str] | None = None,
                  skip: frozenset[Kind] = frozenset()) -> list[Finding]:
    """Every finding on one host but those of the ``skip`` kinds, which are not looked for at all
    (``pip check``'s evaluation is most of drift's controller CPU per host)."""
    pats = list(packages or ())
    out = version_findings(inv, base, pats)
    out += [f for f in duplicate_findings(inv) if selected(f.package or "", pats)]
    if Kind.UNSATISFIED not in skip:
        out += [f for f in unsatisfied_findings(inv) if selected(f.package or "", pats)]
    out += stack_findings(inv, base) if base.host != inv.host else []
    out += [f for f in file_findings(inv) if selected(f.package or "", pats)]
    out += [f for f in overlay_findings(inv) if selected(f.package or "", pats)]
    return [f for f in out if f.kind not in skip]


def overlay_findings(inv: HostInventory) -> list[Finding]:
    """Where a distribution came from, when an overlay brought it: information, not drift."""
    return [Finding(inv.host, Kind.OVERLAY, name, None, d.version, f"{name} {d.version}: {d.overlay}")
            for name, dists in sorted(inv.dists.items()) for d in dists if d.overlay]


def version_findings(inv: HostInventory, base: Baseline, pats: list[str]) -> list[Finding]:
    out = []
    for name, want in sorted(base.versions.items()):
        if not selected(name, pats) or (base.lock and name in FREEZE_EXCLUDED):
            continue
        have = inv.version(name)
        if have is None:
            out.append(Finding(inv.host, Kind.MISSING, name, want, None, f"{name} {want} is not installed"))
        elif have != want:
            out.append(Finding(inv.host, Kind.VERSION, name, want, have, f"{name} {have}, baseline {want}"))
    for name in sorted(set(inv.dists) - set(base.versions)):
        if selected(name, pats) and not (base.lock and name in FREEZE_EXCLUDED):
            have = inv.version(name)
            out.append(Finding(inv.host, Kind.EXTRA, name, None, have, f"{name} {have} is not in the baseline"))
    return out


def duplicate_findings(inv: HostInventory) -> list[Finding]:
    return [
        Finding(inv.host, Kind.DUPLICATE, name, None, inv.version(name),
                f"{len(dists)} dist-info folders: {', '.join(sorted(d.dist_info for d in dists))}")
        for name, dists in sorted(inv.dists.items()) if len(dists) > 1
    ]


def unsatisfied_findings(inv: HostInventory) -> list[Finding]:
    """What ``pip check`` reports, from Requires-Dist and the host's own marker environment
    (``drift_requirements``: an unchanged venv's answer comes from the controller's cache)."""
    dists = {name: [(d.version, d.requires) for d in found] for name, found in inv.dists.items()}
    return [Finding(inv.host, Kind.UNSATISFIED, name, text, actual, detail)
            for name, text, actual, detail in drift_requirements.problems(inv.markers, dists)]


def stack_findings(inv: HostInventory, base: Baseline) -> list[Finding]:
    return [
        Finding(inv.host, Kind.STACK, row, want, inv.stack.get(row), f"{row} {inv.stack.get(row)}, baseline {want}")
        for row, want in base.stack.items() if inv.stack.get(row) != want
    ]


FILE_KINDS = {"modified": Kind.MODIFIED, "missing": Kind.MISSING_FILE, "orphans": Kind.ORPHAN,
              "foreign_shebangs": Kind.FOREIGN_SHEBANG, "patched": Kind.PATCHED, "shared": Kind.SHARED}


def file_findings(inv: HostInventory) -> list[Finding]:
    out: list[Finding] = []
    for key, kind in FILE_KINDS.items():
        for item in (inv.files or {}).get(key, []):
            detail = item["path"]
            if kind is Kind.FOREIGN_SHEBANG:
                detail += f" runs {item['interpreter']}, outside this venv"
            elif kind is Kind.ORPHAN and item.get("left_by"):
                detail += f" (listed only by the shadowed {item['left_by']})"
            elif kind is Kind.PATCHED:
                detail += f" patched by release {item['release']}"
            elif kind is Kind.SHARED:
                owners = [o for o in item.get("owners", []) if o != item["installed"]] + [item["installed"]]
                detail += f" shared by {' and '.join(owners)}; {item['installed']}'s copy is installed"
            out.append(Finding(inv.host, kind, item["dist"], item.get("sha256"), None, detail))
    return out


# --- the report --------------------------------------------------------------------------------

@dataclass
class DriftReport:
    baseline: Baseline
    inventories: dict[str, HostInventory]
    failed: dict[str, HostResult[HostInventory]]
    findings: dict[str, list[Finding]]

    @property
    def drifting_hosts(self) -> list[str]:
        return [h for h, fs in self.findings.items() if any(f.kind not in INFO_KINDS for f in fs)]

    def count(self, *kinds: Kind) -> int:
        return sum(1 for fs in self.findings.values() for f in fs if f.kind in kinds)

    def differing_packages(self) -> list[str]:
        kinds = {Kind.VERSION, Kind.MISSING, Kind.EXTRA, Kind.DUPLICATE}
        return sorted({f.package for fs in self.findings.values() for f in fs if f.kind in kinds and f.package})

    def audited(self) -> dict[str, list[str]]:
        """What each host's audit read, gathered: ``venv PATH`` or the agent's interpreter -> hosts."""
        out: dict[str, list[str]] = {}
        for host, inv in sorted(self.inventories.items()):
            what = f"venv {inv.venv}" if inv.venv else f"{inv.python} (no venv named: the agent's interpreter)"
            out.setdefault(what, []).append(host)
        return out

    def summary(self) -> str:
        total = len(self.inventories) + len(self.failed)
        parts = [f"{len(self.differing_packages())} packages differ"]
        for kind, label in ((Kind.MODIFIED, "files modified"), (Kind.MISSING_FILE, "files missing"),
                            (Kind.ORPHAN, "orphan files"), (Kind.DUPLICATE, "duplicate dist-info"),
                            (Kind.UNSATISFIED, "unsatisfied requirements"), (Kind.STACK, "stack differences"),
                            (Kind.FOREIGN_SHEBANG, "foreign shebangs"), (Kind.PATCHED, "files patched by releases"),
                            (Kind.OVERLAY, "packages from overlays"), (Kind.SHARED, "shared files")):
            if n := self.count(kind):
                parts.append(f"{n} {label}")
        line = f"{len(self.drifting_hosts)} of {total} hosts drift: " + ", ".join(parts)
        if self.failed:
            named = sorted(self.failed)  # a thousand names make no line: each failure has its own below
            more = f" (+{len(named) - FAILED_NAMED} more)" if len(named) > FAILED_NAMED else ""
            line += f"; {len(named)} hosts failed ({', '.join(named[:FAILED_NAMED])}{more})"
        return line


def audit(
    results: Mapping[str, HostResult[HostInventory]], *, baseline_host: str | None = None,
    lock: tuple[Mapping[str, Pin], str] | None = None, packages: Iterable[str] | None = None,
    skip: Iterable[str] = (),
) -> DriftReport:
    """Pure: compare every host that answered against the baseline; failed hosts are kept apart."""
    inventories = {h: r.value for h, r in sorted(results.items()) if r.ok and r.value is not None}
    failed = {h: r for h, r in sorted(results.items()) if not r.ok}
    if lock is not None:
        base = baseline_from_lock(*lock)
    elif baseline_host is not None:
        base = baseline_from_host(inventories, baseline_host)
    else:
        base = baseline_by_majority(inventories)
    skipped = frozenset(Kind(k) for k in skip)
    findings = {h: host_findings(inv, base, packages, skipped) for h, inv in inventories.items()}
    return DriftReport(base, inventories, failed, findings)


def require_a_venv(hosts: Iterable[Host], venv: str | None) -> None:
    """Refuse, before any host is contacted, an audit that names no venv for any host: it would read
    whatever interpreter the agent runs and could call a fleet of differing ML venvs drift-free."""
    if venv:
        return
    if not any(h.vars.get("venv") for h in hosts):
        raise InputError("drift: no venv named for any selected host: pass --venv PATH or set the host var "
                         "`venv` (the audit reads a venv's installed packages)")
