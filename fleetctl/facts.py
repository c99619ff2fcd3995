"""Host facts: what a host is (system, GPUs, Python, the venv's ML stack), as typed data.

``collect_facts`` asks the host (``fleetctl/remote/facts.py`` and, under the venv's python,
``fleetctl/remote/venv_packages.py``); ``parse_facts`` turns those raw answers into dataclasses
and is pure, so it is tested on captured real answers. ``facts_table_rows`` is the human summary.
"""

from __future__ import annotations

import posixpath
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from fleetctl import hostpaths
from fleetctl.errors import AgentError, RemoteOperationError
from fleetctl.gpu.collect import gpu_params
from fleetctl.gpu.health import HostHealth, Thresholds, evaluate
from fleetctl.gpu.smi import GpuFacts, describe_gpus, parse_gpu_facts
from fleetctl.plain import plain
from fleetctl.transport.base import HostSession

# The packages whose versions decide whether an SGLang host works (report order).
STACK_PACKAGES: tuple[str, ...] = (
    "torch", "triton", "sglang", "sgl-kernel", "sglang-kernel", "flashinfer", "transformers",
)


@dataclass(frozen=True)
class PythonInstall:
    """One interpreter found on the host; ``error`` when it would not say its version."""

    path: str
    version: str | None
    realpath: str | None = None
    error: str | None = None


@dataclass
class VenvFacts:
    """The ML stack of one venv; ``error`` set (and the rest empty) when it could not be read."""

    path: str
    python: str
    python_version: str | None = None
    abi: str | None = None  # SOABI, e.g. cpython-312-x86_64-linux-gnu: what extensions must match
    cache_tag: str | None = None
    prefix: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    torch_cuda: str | None = None  # CUDA torch was built for; None for CPU builds or no torch
    duplicates: dict[str, list[str]] = field(default_factory=dict)  # name -> versions of 2+ dist-infos
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HostFacts:
    hostname: str
    os: str | None
    kernel: str | None
    arch: str | None
    cpus: int | None
    cpus_usable: int | None  # sched_getaffinity: what a cgroup/taskset leaves us
    memory_total: int | None  # bytes
    memory_available: int | None  # bytes
    disks: dict[str, dict[str, int] | None]  # path -> {"free", "total"} bytes; None: no such path
    pythons: list[PythonInstall]
    interpreter: PythonInstall  # the one the agent runs on
    gpus: GpuFacts
    venv: VenvFacts | None = None
    gpu_health: HostHealth | None = None  # the rules of gpu_health.py over ``gpus``

    def to_dict(self) -> dict[str, Any]:
        out = plain(replace(self, gpu_health=None))
        out["gpu_health"] = self.gpu_health.to_dict() if self.gpu_health else None
        return out


def venv_python(venv: str) -> str:
    return posixpath.join(venv.rstrip("/") or "/", "bin", "python")


def _python_install(raw: dict[str, Any]) -> PythonInstall:
    return PythonInstall(
        path=str(raw.get("path") or raw.get("executable") or ""),
        version=raw.get("version"),
        realpath=raw.get("realpath"),
        error=raw.get("error"),
    )


def _missing_python(check: dict[str, Any] | None) -> str | None:
    """The error for a venv whose bin/python cannot run, from the facts op's ``venv`` check."""
    if not check or check.get("python_exists", True):
        return None
    python = check.get("python", "?")
    if not check.get("exists", True):
        return f"no python at {python} (no folder {check.get('path', '?')})"
    link = check.get("python_link")
    # A venv copied from another host often links to an interpreter this host does not have.
    return f"no python at {python}" + (f" (dangling link to {link})" if link else "")


def parse_venv(raw_venv: dict[str, Any] | None, venv: str, check: dict[str, Any] | None = None) -> VenvFacts:
    facts = VenvFacts(path=venv, python=venv_python(venv))
    facts.error = _missing_python(check)
    if facts.error:
        return facts
    if raw_venv is None:
        facts.error = "venv packages were not collected"
        return facts
    if raw_venv.get("error") and not raw_venv.get("packages"):
        facts.error = str(raw_venv["error"])
        return facts
    facts.python = str(raw_venv.get("executable") or facts.python)
    facts.python_version = raw_venv.get("version")
    facts.abi = raw_venv.get("soabi")
    facts.cache_tag = raw_venv.get("cache_tag")
    facts.prefix = raw_venv.get("prefix")
    facts.packages = dict(raw_venv.get("packages") or {})
    facts.torch_cuda = (raw_venv.get("torch") or {}).get("cuda")
    facts.duplicates = {k: list(v) for k, v in (raw_venv.get("duplicates") or {}).items()}
    facts.error = raw_venv.get("error")
    return facts


def parse_facts(raw_facts: dict[str, Any], raw_venv: dict[str, Any] | None, venv: str | None,
                thresholds: Thresholds | None = None) -> HostFacts:
    """The hosts' raw answers -> HostFacts, GPU health judged with ``thresholds`` (the defaults when
    None). Pure; tolerates missing keys (older remote scripts)."""
    cpus = raw_facts.get("cpus") or {}
    memory = raw_facts.get("memory") or {}
    os_release = raw_facts.get("os") or {}
    gpus = parse_gpu_facts(raw_facts.get("nvidia_smi"))
    return HostFacts(
        hostname=str(raw_facts.get("hostname") or ""),
        os=os_release.get("pretty_name"),
        kernel=raw_facts.get("kernel"),
        arch=raw_facts.get("arch"),
        cpus=cpus.get("count"),
        cpus_usable=cpus.get("usable"),
        memory_total=memory.get("total"),
        memory_available=memory.get("available"),
        disks=dict(raw_facts.get("disks") or {}),
        pythons=[_python_install(p) for p in raw_facts.get("pythons") or []],
        interpreter=_python_install(raw_facts.get("interpreter") or {}),
        gpus=gpus,
        venv=parse_venv(raw_venv, venv, raw_facts.get("venv")) if venv else None,
        gpu_health=evaluate(gpus, thresholds or Thresholds(), str(raw_facts.get("hostname") or "")),
    )


def collect_facts(session: HostSession, venv: str | None = None) -> HostFacts:
    """Ask one host for its facts (and its venv's ML stack when ``venv`` is given)."""
    thresholds = Thresholds.from_vars(session.vars, session.name)
    params = {**({"venv": venv} if venv else {}), **gpu_params(session), "cache_dir": hostpaths.cache_dir(session.vars)}
    raw = session.call("facts", params)
    if not isinstance(raw, dict):
        raise AgentError(session.name, f"facts answered a {type(raw).__name__}, not an object")
    raw_venv: dict[str, Any] | None = None
    if venv and _missing_python(raw.get("venv")) is None:
        python = venv_python(venv)
        try:
            answer = session.call("venv_packages", {}, python=python)
        except RemoteOperationError as exc:  # the venv's python is broken: a fact, not a host failure
            answer = {"error": f"{python} could not run venv_packages: {exc.reason}"}
        raw_venv = answer if isinstance(answer, dict) else {"error": "venv_packages answered no object"}
    return parse_facts(raw, raw_venv, venv, thresholds)


def _bytes(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def _venv_rows(venv: VenvFacts) -> list[tuple[str, str]]:
    if venv.error:
        return [("venv", f"{venv.path}: error: {venv.error}")]
    rows = [("venv", f"{venv.path}: Python {venv.python_version or '?'} ({venv.abi or '?'})")]
    for name in STACK_PACKAGES:
        version = venv.packages.get(name)
        if version is None and name in ("sgl-kernel", "sglang-kernel"):
            continue  # one of the two names is normal; the other row would only be noise
        text = version or "-"
        if name == "torch" and version:
            text += f" (CUDA {venv.torch_cuda})" if venv.torch_cuda else " (no CUDA)"
        if name in venv.duplicates:
            text += f" [DUPLICATE dist-info: {', '.join(venv.duplicates[name])}]"
        rows.append((name, text))
    return rows


def facts_table_rows(facts: HostFacts) -> list[tuple[str, str]]:
    """(label, value) rows for a human summary of one host."""
    rows = [
        ("host", facts.hostname),
        ("os", f"{facts.os or '?'}, kernel {facts.kernel or '?'} ({facts.arch or '?'})"),
        ("cpus", f"{facts.cpus if facts.cpus is not None else '?'} ({facts.cpus_usable} usable)"),
        ("memory", f"{_bytes(facts.memory_available)} available of {_bytes(facts.memory_total)}"),
    ]
    for path, usage in facts.disks.items():
        value = "absent" if usage is None else f"{_bytes(usage['free'])} free of {_bytes(usage['total'])}"
        rows.append((f"disk {path}", value))
    versions = sorted({p.version for p in facts.pythons if p.version})
    rows.append(("python", f"{facts.interpreter.version} (agent); found: {', '.join(versions) or 'none'}"))
    rows.append(("gpus", describe_gpus(facts.gpus)))
    if facts.gpu_health is not None and (facts.gpus.gpus or facts.gpu_health.level.value != "green"):
        rows.append(("gpu health", facts.gpu_health.summary()))
    if facts.venv is not None:
        rows.extend(_venv_rows(facts.venv))
    return rows
