"""``nvidia-smi -q -x`` -> typed GPU facts (controller side, pure).

The host side (``fleetctl/remote/facts.py``) runs ``nvidia-smi -q -x`` once and captures its raw
text, rc and stderr (plus ``nvidia-smi nvlink`` and the kernel log's Xid lines: ``gpu_logs.py``).
Everything about the XML lives here, tested against real captures in ``tests/fixtures/nvidia-smi/``.
The health rules over these facts are ``gpu_health.py``.

Element names differ between drivers (``clocks_throttle_reasons`` became ``clocks_event_reasons``;
ECC counters were ``single_bit``/``double_bit`` totals before they were ``sram_*``/``dram_*``; the
temperature limits became relative "T.Limit" values): both shapes are read.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fleetctl.gpu.logs import KernelLog, NvLink, parse_kernel_log, parse_nvlink
from fleetctl.gpu.topo import TopoMatrix, parse_topo
from fleetctl.gpu.xml_sections import Fabric, GpuProcess, ProcessOwners, parse_fabric, parse_owners, parse_processes
from fleetctl.plain import plain

# What nvidia-smi prints when a field has no value on this GPU or driver.
_MISSING = {
    "", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]",
    "none", "unknown error", "insufficient permissions",
}
_INT_RE = re.compile(r"^(-?\d+)")
_FLOAT_RE = re.compile(r"^(-?\d+(?:\.\d+)?)")
# The XML carries no compute capability: it follows from the architecture (and, where one
# architecture spans two, the name). None where unknown rather than a guess.
_CAPABILITY = {"volta": "7.0", "turing": "7.5", "ada lovelace": "8.9", "hopper": "9.0"}
_CAPABILITY_BY_NAME = ((r"A100|A30\b|A800", "8.0"), (r"\bA\d+|RTX A|GeForce RTX 30", "8.6"),
                       (r"B300|GB300", "10.3"), (r"B200|GB200|B100", "10.0"),
                       (r"RTX PRO|GeForce RTX 50|RTX 5\d\d\d", "12.0"))


@dataclass(frozen=True)
class GpuReadings:
    """What the health rules read for one GPU; None where nvidia-smi gave no value."""

    ecc_mode: str | None = None
    ecc_volatile_correctable: int | None = None
    ecc_volatile_uncorrectable: int | None = None
    ecc_aggregate_correctable: int | None = None
    ecc_aggregate_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remapped_correctable: int | None = None
    remapped_uncorrectable: int | None = None
    retired_single_bit: int | None = None
    retired_double_bit: int | None = None
    retired_pending: bool | None = None
    clock_events: dict[str, bool] = field(default_factory=dict)  # hw_thermal_slowdown -> active?
    temperature_c: int | None = None
    slowdown_margin_c: int | None = None  # degrees left before HW slowdown
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    performance_state: str | None = None


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
    architecture: str | None = None
    serial: str | None = None
    vbios_version: str | None = None
    inforom_version: str | None = None  # the InfoROM image: the board's firmware
    gsp_firmware_version: str | None = None
    readings: GpuReadings = field(default_factory=GpuReadings)
    mig_pending: str | None = None  # the MIG mode after the next GPU reset
    fabric: Fabric = field(default_factory=Fabric)
    processes: list[GpuProcess] = field(default_factory=list)

    @property
    def sglang_name(self) -> str:
        return sglang_device_name(self.name)


@dataclass
class GpuFacts:
    """All GPUs of one host; ``error`` says why nvidia-smi gave no (complete) answer."""

    gpus: list[GpuInfo] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None  # highest CUDA the driver supports
    error: str | None = None
    nvidia_smi: str | None = None  # path of the binary; None when the host has no nvidia-smi
    nvlink: dict[int, list[NvLink]] = field(default_factory=dict)  # GPU index -> links; {} without NVLink
    nvlink_error: str | None = None
    kernel_log: KernelLog | None = None  # None when it was not read (no nvidia-smi, or not asked)
    topology: TopoMatrix | None = None  # ``topo -m``, run only where there are 2 GPUs or more
    topology_error: str | None = None
    process_owners: ProcessOwners | None = None  # whose the GPU processes are; None when not asked

    @property
    def count(self) -> int:
        return len(self.gpus)

    def versions(self, attr: str) -> str | None:
        """One GPU attribute across the host's GPUs: "A" when all agree, "A + B" when they differ."""
        seen = sorted({v for g in self.gpus if (v := getattr(g, attr))})
        return " + ".join(seen) if seen else None

    def to_dict(self) -> dict[str, Any]:
        return plain(self)  # dataclasses.asdict's answer, for less CPU (a fleet's worth per command)


def sglang_device_name(name: str) -> str:
    """The device_name SGLang puts in fused-MoE config file names ("NVIDIA H200" -> "NVIDIA_H200")."""
    # SGLang does exactly get_device_name().replace(" ", "_"); no other normalisation.
    return name.replace(" ", "_")


# --- element values ------------------------------------------------------------------------------

def _text(node: ET.Element | None, path: str) -> str | None:
    found = node.find(path) if node is not None else None
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text.lower() in _MISSING else text


def _int(node: ET.Element | None, path: str) -> int | None:
    text = _text(node, path)
    m = _INT_RE.match(text) if text else None
    return int(m.group(1)) if m else None


def _float(node: ET.Element | None, path: str) -> float | None:
    text = _text(node, path)
    m = _FLOAT_RE.match(text) if text else None
    return float(m.group(1)) if m else None


def _flag(node: ET.Element | None, path: str) -> bool | None:
    text = (_text(node, path) or "").lower()
    if text in ("enabled", "on", "yes", "active"):
        return True
    if text in ("disabled", "off", "no", "not active"):
        return False
    return None


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ecc_totals(node: ET.Element | None) -> tuple[int | None, int | None]:
    """(correctable, uncorrectable) of one ``volatile`` / ``aggregate`` block, either schema."""
    if node is None:
        return None, None
    if node.find("single_bit") is not None or node.find("double_bit") is not None:  # before R535
        return _int(node, "single_bit/total"), _int(node, "double_bit/total")
    corr: list[int | None] = []
    unc: list[int | None] = []
    for child in node:
        if child.tag.endswith("_threshold_exceeded"):
            continue
        if "uncorrectable" in child.tag:
            unc.append(_int(node, child.tag))
        elif "correctable" in child.tag:
            corr.append(_int(node, child.tag))
    return _sum(corr), _sum(unc)


def _clock_events(gpu: ET.Element) -> dict[str, bool]:
    block = gpu.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if block is None:
        block, prefix = gpu.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
    events: dict[str, bool] = {}
    for child in block if block is not None else []:
        active = _flag(block, child.tag)
        if active is not None:
            events[child.tag.removeprefix(prefix)] = active
    return events


def _slowdown_margin(temp: ET.Element | None) -> int | None:
    current, slowdown = _int(temp, "gpu_temp"), _int(temp, "gpu_temp_slow_threshold")
    if current is not None and slowdown is not None:  # absolute limits (older drivers, most GPUs)
        return slowdown - current
    headroom, slow_at = _int(temp, "gpu_temp_tlimit"), _int(temp, "gpu_temp_slow_tlimit_threshold")
    if headroom is not None and slow_at is not None:  # relative to T.Limit: slowdown when headroom hits slow_at
        return headroom - slow_at
    return None


def _readings(gpu: ET.Element) -> GpuReadings:
    ecc = gpu.find("ecc_errors")
    vol_c, vol_u = _ecc_totals(ecc.find("volatile") if ecc is not None else None)
    agg_c, agg_u = _ecc_totals(ecc.find("aggregate") if ecc is not None else None)
    rows, pages, temp = gpu.find("remapped_rows"), gpu.find("retired_pages"), gpu.find("temperature")
    power = gpu.find("gpu_power_readings")
    if power is None:
        power = gpu.find("power_readings")  # before R530
    link = gpu.find("pci/pci_gpu_link_info")
    return GpuReadings(
        ecc_mode=_text(gpu, "ecc_mode/current_ecc"),
        ecc_volatile_correctable=vol_c, ecc_volatile_uncorrectable=vol_u,
        ecc_aggregate_correctable=agg_c, ecc_aggregate_uncorrectable=agg_u,
        remap_pending=_flag(rows, "remapped_row_pending"), remap_failure=_flag(rows, "remapped_row_failure"),
        remapped_correctable=_int(rows, "remapped_row_corr"), remapped_uncorrectable=_int(rows, "remapped_row_unc"),
        retired_single_bit=_int(pages, "multiple_single_bit_retirement/retired_count"),
        retired_double_bit=_int(pages, "double_bit_retirement/retired_count"),
        retired_pending=_flag(pages, "pending_retirement") if _text(pages, "pending_retirement")
        else _flag(pages, "pending_blacklist"),
        clock_events=_clock_events(gpu),
        temperature_c=_int(temp, "gpu_temp"), slowdown_margin_c=_slowdown_margin(temp),
        power_draw_w=_float(power, "average_power_draw") or _float(power, "power_draw"),
        power_limit_w=_float(power, "current_power_limit") or _float(power, "power_limit"),
        pcie_gen_current=_int(link, "pcie_gen/current_link_gen"), pcie_gen_max=_int(link, "pcie_gen/max_link_gen"),
        pcie_width_current=_int(link, "link_widths/current_link_width"),
        pcie_width_max=_int(link, "link_widths/max_link_width"),
        performance_state=_text(gpu, "performance_state"),
    )


def compute_capability(architecture: str | None, name: str) -> str | None:
    for pattern, capability in _CAPABILITY_BY_NAME:
        if re.search(pattern, name):
            return capability
    return _CAPABILITY.get((architecture or "").lower())


def parse_gpu(index: int, gpu: ET.Element, driver: str | None) -> GpuInfo:
    name = _text(gpu, "product_name") or "?"
    architecture = _text(gpu, "product_architecture")
    return GpuInfo(
        index=index,  # nvidia-smi's index is the document's order (PCI order), not the minor number
        name=name, uuid=_text(gpu, "uuid"), memory_mib=_int(gpu, "fb_memory_usage/total"),
        driver_version=driver, compute_capability=compute_capability(architecture, name),
        persistence_mode=_flag(gpu, "persistence_mode"), mig_mode=_text(gpu, "mig_mode/current_mig"),
        pci_bus_id=_text(gpu, "pci/pci_bus_id") or gpu.get("id"), architecture=architecture,
        serial=_text(gpu, "serial"), vbios_version=_text(gpu, "vbios_version"),
        inforom_version=_text(gpu, "inforom_version/img_version"),
        gsp_firmware_version=_text(gpu, "gsp_firmware_version"), readings=_readings(gpu),
        mig_pending=_text(gpu, "mig_mode/pending_mig"), fabric=parse_fabric(gpu), processes=parse_processes(gpu),
    )


def parse_xml(text: str) -> tuple[list[GpuInfo], str | None, str | None]:
    """(GPUs, driver version, CUDA version) of one ``nvidia-smi -q -x`` document; ValueError if not one."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"nvidia-smi -q -x printed no readable XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"nvidia-smi -q -x printed <{root.tag}>, not <nvidia_smi_log>")
    driver, cuda = _text(root, "driver_version"), _text(root, "cuda_version")
    return [parse_gpu(i, g, driver) for i, g in enumerate(root.findall("gpu"))], driver, cuda


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
    if raw is None or raw.get("path") is None:
        return GpuFacts()
    facts = GpuFacts(nvidia_smi=raw.get("path"))
    xml = raw.get("xml")
    facts.error = command_failure(xml)
    if "kernel_log" in raw:
        facts.kernel_log = parse_kernel_log(raw.get("kernel_log"))
    if facts.error is not None or xml is None:
        return facts
    if xml.get("truncated"):
        facts.error = "nvidia-smi -q -x output was cut at the host's size limit"
        return facts
    try:
        facts.gpus, facts.driver_version, facts.cuda_version = parse_xml(xml.get("stdout") or "")
    except ValueError as exc:
        facts.error = str(exc)
        return facts
    if not facts.gpus:
        facts.error = "nvidia-smi listed no GPUs"
    facts.nvlink, facts.nvlink_error = parse_nvlink(raw.get("nvlink_status"), raw.get("nvlink_errors"))
    facts.topology, facts.topology_error = _topology(raw.get("topo"))
    if "processes" in raw:
        facts.process_owners = parse_owners(raw.get("processes"))
    return facts


def _topology(result: dict[str, Any] | None) -> tuple[TopoMatrix | None, str | None]:
    """The host's ``topo -m`` capture (absent with one GPU) -> (matrix, why none)."""
    if result is None:
        return None, None
    if result.get("rc") != 0:
        failed = command_failure(result) or "failed"
        return None, "nvidia-smi topo -m " + failed.removeprefix("nvidia-smi ")
    try:
        return parse_topo(str(result.get("stdout") or "")), None
    except ValueError as exc:
        return None, str(exc)


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
