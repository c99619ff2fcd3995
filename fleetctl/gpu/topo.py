"""``nvidia-smi topo -m`` -> the GPU connection matrix (controller side, pure).

The matrix is tab-separated: a header of device columns (``GPU0``.., ``NIC0``..) then the affinity
columns (``CPU Affinity``, ``NUMA Affinity``, ``GPU NUMA ID``), one row per device, a ``Legend:``
and, with NICs, a ``NIC Legend:`` (``NIC0: mlx5_0``). Cells: ``X`` (self), ``NV#`` (a bonded set of
# NVLinks), ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS`` (PCIe paths, nearest first). Drivers
underline the header with ANSI escapes even into a pipe, and leave an empty cell between the NUMA
affinity and the GPU NUMA ID: both are tolerated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE = re.compile(r"^(GPU|NIC)\d+$")
_NVLINK = re.compile(r"^NV(\d+)$")
PCIE_PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first


@dataclass
class TopoMatrix:
    """GPU pairs and what connects them; ``affinity[gpu]`` holds that row's affinity columns."""

    gpus: list[int] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)  # "a-b" (a < b) -> "NV18", "SYS", .. (JSON keys)
    affinity: dict[int, dict[str, str]] = field(default_factory=dict)  # 0 -> {"CPU Affinity": "0-55", ..}
    nics: dict[str, str] = field(default_factory=dict)  # "NIC0" -> "mlx5_0"
    legend: dict[str, str] = field(default_factory=dict)  # "NV#" -> its meaning, as printed

    def link(self, a: int, b: int) -> str | None:
        """What connects two GPUs, as printed ("NV18", "SYS"); None when the matrix has no such cell."""
        return self.links.get(pair_key(a, b))


def pair_key(a: int, b: int) -> str:
    return f"{min(a, b)}-{max(a, b)}"


def nvlink_count(cell: str | None) -> int | None:
    """18 for "NV18"; None for a PCIe path or no cell."""
    m = _NVLINK.match(cell or "")
    return int(m.group(1)) if m else None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.rstrip("\n").split("\t")]


def _header(lines: list[str]) -> tuple[int, list[str], list[str]] | None:
    """(line index, device columns, affinity column names) of the matrix header."""
    for i, line in enumerate(lines):
        cells = [c for c in _cells(line) if c]
        if cells and cells[0] == "GPU0":
            devices = [c for c in cells if _DEVICE.match(c)]
            if "\t" not in line:  # space-aligned (a copy from a web page): the names are single words
                return i, devices, []
            return i, devices, cells[len(devices):]
    return None


def _legends(lines: list[str], topo: TopoMatrix) -> None:
    for line in lines:
        nic = re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", line)
        if nic:
            topo.nics[nic.group(1)] = nic.group(2)
            continue
        entry = re.match(r"^\s*(X|NV#|PIX|PXB|PHB|NODE|SYS|SOC)\s+=\s+(.+?)\s*$", line)
        if entry:
            topo.legend[entry.group(1)] = entry.group(2)


def parse_topo(text: str) -> TopoMatrix:
    """The GPU-to-GPU part of ``topo -m``; ValueError when the text holds no matrix."""
    lines = _ANSI.sub("", text).splitlines()
    found = _header(lines)
    if found is None:
        raise ValueError("nvidia-smi topo -m printed no matrix (no GPU0 header)")
    start, devices, affinity_names = found
    topo = TopoMatrix()
    for line in lines[start + 1:]:
        if not line.strip() or line.startswith("Legend"):
            break
        cells = _cells(line) if "\t" in line else line.split()
        row = cells[0]
        if not row.startswith("GPU"):
            continue  # a NIC's row: its GPU columns repeat the GPUs' NIC columns
        a = int(row[3:])
        topo.gpus.append(a)
        for name, cell in zip(devices, cells[1:1 + len(devices)], strict=False):
            if name.startswith("GPU") and int(name[3:]) != a:
                b = int(name[3:])
                topo.links[pair_key(a, b)] = cell
        rest = [c for c in cells[1 + len(devices):] if c]
        topo.affinity[a] = dict(zip(affinity_names, rest, strict=False))
    _legends(lines[start:], topo)
    return topo
