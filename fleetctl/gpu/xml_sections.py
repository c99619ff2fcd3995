"""Two sections of one GPU's ``nvidia-smi -q -x`` element (controller side, pure): ``<fabric>``
(the GPU's registration with the NVLink fabric, which the fabric manager drives on NVSwitch
systems) and ``<processes>`` (who holds the GPU and how much memory), with what the host found
about those processes' owners."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

# nvidia-smi's words for "no value here"; the fabric's "Not Supported" means the same (no fabric).
_NONE = {"", "n/a", "[n/a]", "not supported", "[not supported]", "none"}


def _value(node: ET.Element | None, path: str) -> str | None:
    found = node.find(path) if node is not None else None
    text = (found.text or "").strip() if found is not None else ""
    return None if text.lower() in _NONE else text


@dataclass(frozen=True)
class Fabric:
    """``<fabric>``: None everywhere (N/A) on a GPU that has no NVLink fabric."""

    state: str | None = None  # "Not Started", "In Progress", "Completed"
    status: str | None = None  # "Success", or the error once the state is Completed
    clique_id: str | None = None
    cluster_uuid: str | None = None
    health_summary: str | None = None  # "Healthy", "Unhealthy", "Limited Capacity"
    bandwidth: str | None = None  # "Full", "Degraded"

    @property
    def present(self) -> bool:
        return self.state is not None


def parse_fabric(gpu: ET.Element) -> Fabric:
    node = gpu.find("fabric")
    if node is None:  # drivers before the fabric section
        return Fabric()
    return Fabric(state=_value(node, "state"), status=_value(node, "status"), clique_id=_value(node, "cliqueId"),
                  cluster_uuid=_value(node, "clusterUuid"), health_summary=_value(node, "health/summary"),
                  bandwidth=_value(node, "health/bandwidth"))


@dataclass(frozen=True)
class GpuProcess:
    """One ``<process_info>``: a process holding this GPU."""

    pid: int
    name: str  # process_name as printed (a path, or a title a program set: "sglang::scheduler_TP0")
    type: str | None  # "C" compute, "G" graphics, "C+G"
    used_memory_mib: int | None  # None where nvidia-smi may not say (N/A)


def parse_processes(gpu: ET.Element) -> list[GpuProcess]:
    out = []
    for info in gpu.findall("processes/process_info"):
        pid = _value(info, "pid")
        if pid is None or not pid.isdigit():
            continue
        memory = re.match(r"^(\d+)", _value(info, "used_memory") or "")
        out.append(GpuProcess(int(pid), _value(info, "process_name") or "?", _value(info, "type"),
                              int(memory.group(1)) if memory else None))
    return out


@dataclass(frozen=True)
class ProcessOwners:
    """What the host found about its GPU processes (``remote/facts.py``): the live pids of the
    release's server (its supervisor's pidfiles), and per GPU pid its ancestors and systemd unit."""

    service_pids: tuple[int, ...] = ()  # tuples, not sets: facts --json prints them as lists
    ancestors: dict[int, tuple[int, ...]] = field(default_factory=dict)  # pid -> parent, grandparent, ..
    units: dict[int, str] = field(default_factory=dict)  # pid -> "sglang.service" (from /proc/PID/cgroup)
    hidden: tuple[int, ...] = ()  # pids not in this /proc (another pid namespace)

    def of_release(self, pid: int) -> str | None:
        """Why ``pid`` is the release's server ("unit sglang.service", "child of 4200"); None if not."""
        unit = self.units.get(pid) or ""
        if re.match(r"^sglang(@[^/]*)?\.service$", unit):
            return f"unit {unit}"
        if pid in self.service_pids:
            return "the server"
        for parent in self.ancestors.get(pid, ()):
            if parent in self.service_pids:
                return f"child of {parent}"
        return None


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values or [] if isinstance(v, int | str) and str(v).isdigit()]


def parse_owners(raw: dict[str, Any] | None) -> ProcessOwners:
    raw = raw if isinstance(raw, dict) else {}
    found = raw.get("pids")
    pids: dict[Any, Any] = found if isinstance(found, dict) else {}
    ancestors: dict[int, tuple[int, ...]] = {}
    units: dict[int, str] = {}
    hidden: set[int] = set()
    for key, info in pids.items():
        if not str(key).isdigit() or not isinstance(info, dict):
            continue
        pid = int(key)
        if not info.get("found"):
            hidden.add(pid)
        ancestors[pid] = tuple(_ints(info.get("ancestors")))
        if info.get("unit"):
            units[pid] = str(info["unit"])
    return ProcessOwners(tuple(sorted(set(_ints(raw.get("service_pids"))))), ancestors, units, tuple(sorted(hidden)))
