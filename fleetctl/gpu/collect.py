"""One host's GPU facts over its agent: one ``nvidia-smi -q -x`` (with health, NVLink, ``topo -m``, the
GPU processes' owners and the kernel log's Xid lines too), the binary named by the host's ``nvidia_smi``
variable."""

from __future__ import annotations

from typing import Any

from fleetctl import hostpaths
from fleetctl.errors import AgentError
from fleetctl.gpu.smi import GpuFacts, parse_gpu_facts
from fleetctl.transport.base import HostSession, Step


def gpu_params(session: HostSession) -> dict[str, Any]:
    """The facts op's GPU parameters from the host's variables: ``nvidia_smi`` names the binary; the
    service's folder holds the pidfiles that tell the release's server from other GPU processes."""
    path = session.vars.get("nvidia_smi")
    return {"service_dir": hostpaths.service_dir(session.vars), **({"nvidia_smi": str(path)} if path else {})}


def gpu_step(session: HostSession, health: bool = True) -> Step:
    """The call that asks one host for its GPU facts alone, for a sequence with other calls."""
    return Step("facts", {"gpu_only": True, "gpu_health": health, **gpu_params(session)})


def gpu_from_answer(host: str, raw: Any) -> GpuFacts:
    """``gpu_step``'s answer -> GpuFacts."""
    if not isinstance(raw, dict):
        raise AgentError(host, f"facts answered a {type(raw).__name__}, not an object")
    return parse_gpu_facts(raw.get("nvidia_smi"))


def collect_gpu(session: HostSession, health: bool = True) -> GpuFacts:
    """One host's GPU facts alone (one ``nvidia-smi -q -x``; with ``health``, NVLink and Xids too)."""
    step = gpu_step(session, health)
    return gpu_from_answer(session.name, session.call(step.module, step.params))
