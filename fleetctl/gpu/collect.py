"""One host's GPU facts over its agent: one ``nvidia-smi -q -x`` (with health, NVLink, ``topo -m``, the
GPU processes' owners and the kernel log's Xid lines too), the binary named by the host's ``nvidia_smi``
variable."""

from __future__ import annotations

from typing import Any

from fleetctl import hostpaths
from fleetctl.errors import AgentError
from fleetctl.gpu.smi import GpuFacts, parse_gpu_facts
from fleetctl.transport.base import HostSession


def gpu_params(session: HostSession) -> dict[str, Any]:
    """The facts op's GPU parameters from the host's variables: ``nvidia_smi`` names the binary; the
    service's folder holds the pidfiles that tell the release's server from other GPU processes."""
    path = session.vars.get("nvidia_smi")
    return {"service_dir": hostpaths.service_dir(session.vars), **({"nvidia_smi": str(path)} if path else {})}


def collect_gpu(session: HostSession, health: bool = True) -> GpuFacts:
    """One host's GPU facts alone (one ``nvidia-smi -q -x``; with ``health``, NVLink and Xids too)."""
    raw = session.call("facts", {"gpu_only": True, "gpu_health": health, **gpu_params(session)})
    if not isinstance(raw, dict):
        raise AgentError(session.name, f"facts answered a {type(raw).__name__}, not an object")
    return parse_gpu_facts(raw.get("nvidia_smi"))
