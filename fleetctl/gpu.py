"""nvidia-smi output -> typed GPU facts (controller side, pure).

The host side (``fleetctl/remote/facts.py``) only captures raw text, rc and stderr of
``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` and of plain ``nvidia-smi`` (whose
header holds "CUDA Version: 12.8"). Everything about their format lives here, tested against
real captures in ``tests/fixtures/nvidia-smi/``.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

# The exact --query-gpu field list the host runs; columns are parsed in this order.
QUERY_FIELDS: tuple[str, ...] = (
    "index", "name", "uuid", "memory.total", "driver_version", "compute_cap",
    "persistence_mode", "mig.mode.current", "pci.bus_id",
)
# What nvidia-smi prints when a field has no value on this GPU or driver.
_MISSING = {
    "", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]",
}
_CUDA_RE = re.compile(r"CUDA Version:\s*([0-9][0-9.]*)")
_DRIVER_RE = re.compile(r"Driver Version:\s*([0-9][0-9.]*)")
_MIB_RE = re.compile(r"^(\d+)\s*(?:MiB)?$", re.IGNORECASE)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as nvidia-smi describes it."""

    index: int
    name: str
    uuid: str | None
    memory_mib: int | None
    driver_version: str | None
    compute_capability: str | None  # "9.0" for Hopper, "12.0" for RTX PRO 6000 Blackwell
    persistence_mode: bool | None
    mig_mode: str | None  # "Enabled" / "Disabled"; None where MIG does not apply ([N/A])
    pci_bus_id: str | None

    @property
    def sglang_name(self) -> str:
        return sglang_device_name(self.name)


@dataclass
class GpuFacts:
    """All GPUs of one host; ``error`` says why nvidia-smi gave no (complete) answer."""

    gpus: list[GpuInfo] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None  # highest CUDA the driver supports, from the header
    error: str | None = None
    nvidia_smi: str | None = None  # path of the binary; None when the host has no nvidia-smi

    @property
    def count(self) -> int:
        return len(self.gpus)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sglang_device_name(name: str) -> str:
    """The device_name SGLang puts in fused-MoE config file names ("NVIDIA H200" -> "NVIDIA_H200")."""
    # SGLang does exactly get_device_name().replace(" ", "_"); no other normalisation.
    return name.replace(" ", "_")


def _value(raw: str) -> str | None:
    text = raw.strip()
    return None if text.lower() in _MISSING else text


def _enabled(raw: str) -> bool | None:
    text = _value(raw)
    if text is None:
        return None
    lowered = text.lower()
    if lowered in ("enabled", "on"):
        return True
    if lowered in ("disabled", "off"):
        return False
    return None


def _mib(raw: str) -> int | None:
    text = _value(raw)
    match = _MIB_RE.match(text) if text else None
    return int(match.group(1)) if match else None


def parse_query_line(line: str) -> GpuInfo | None:
    """One CSV row of the --query-gpu output; None when it does not have the expected shape."""
    cells = next(csv.reader([line], skipinitialspace=True), [])
    index = cells[0].strip() if cells else ""
    if len(cells) != len(QUERY_FIELDS) or not index.isdigit() or _value(cells[1]) is None:
        return None
    return GpuInfo(
        index=int(index),
        name=cells[1].strip(),
        uuid=_value(cells[2]),
        memory_mib=_mib(cells[3]),
        driver_version=_value(cells[4]),
        compute_capability=_value(cells[5]),
        persistence_mode=_enabled(cells[6]),
        mig_mode=_value(cells[7]),
        pci_bus_id=_value(cells[8]),
    )


def parse_query_csv(text: str) -> tuple[list[GpuInfo], list[str]]:
    """All rows of the --query-gpu output: (GPUs, lines that could not be parsed)."""
    gpus: list[GpuInfo] = []
    bad: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        gpu = parse_query_line(line)
        if gpu is None:
            bad.append(line.strip())
        else:
            gpus.append(gpu)
    return gpus, bad


def parse_header(text: str) -> tuple[str | None, str | None]:
    """(driver version, CUDA version) from plain nvidia-smi's banner."""
    driver = _DRIVER_RE.search(text)
    cuda = _CUDA_RE.search(text)
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


def command_failure(result: dict[str, Any] | None) -> str | None:
    """Why a captured nvidia-smi run failed, in one line; None when it exited 0."""
    if not result:
        return "nvidia-smi was not run"
    if result.get("rc") is None:
        return f"nvidia-smi did not run: {result.get('error') or 'no exit status'}"
    if result["rc"] == 0:
        return None
    # The "couldn't communicate with the NVIDIA driver" message goes to stdout, not stderr.
    text = (result.get("stderr") or "").strip() or (result.get("stdout") or "").strip()
    first = text.splitlines()[0].strip() if text else "no output"
    return f"nvidia-smi exited {result['rc']}: {first}"


def parse_gpu_facts(raw: dict[str, Any] | None) -> GpuFacts:
    """The ``nvidia_smi`` object of the host's facts answer -> GpuFacts (never raises on bad text)."""
    if raw is None:
        return GpuFacts()
    facts = GpuFacts(nvidia_smi=raw.get("path"))
    header = raw.get("header") or {}
    if header.get("rc") == 0:
        facts.driver_version, facts.cuda_version = parse_header(header.get("stdout") or "")
    query = raw.get("query")
    facts.error = command_failure(query)
    if facts.error is not None or query is None:
        return facts
    facts.gpus, bad = parse_query_csv(query.get("stdout") or "")
    if bad:
        facts.error = f"unparsed nvidia-smi line(s): {'; '.join(bad[:3])}"
    elif not facts.gpus:
        facts.error = "nvidia-smi listed no GPUs"
    drivers = [g.driver_version for g in facts.gpus if g.driver_version]
    if drivers:
        facts.driver_version = drivers[0]
    return facts


def describe_gpus(facts: GpuFacts) -> str:
    """One human line: "8x NVIDIA H200 (143771 MiB), driver 570.133.20, CUDA 12.8" or "no GPU"."""
    if facts.nvidia_smi is None and not facts.gpus:
        return "no GPU (nvidia-smi not found)"
    if not facts.gpus:
        return f"no GPU: {facts.error}" if facts.error else "no GPU"
    models = Counter((g.name, g.memory_mib) for g in facts.gpus)
    parts = []
    for (name, mib), n in models.items():
        parts.append(f"{n}x {name}" + (f" ({mib} MiB)" if mib is not None else ""))
    line = " + ".join(parts)  # mixed models: "4x A (..) + 4x B (..)"
    if facts.driver_version:
        line += f", driver {facts.driver_version}"
    if facts.cuda_version:
        line += f", CUDA {facts.cuda_version}"
    if facts.error:
        line += f" [{facts.error}]"
    return line
