"""The GPU's text outputs beside its XML (controller side, pure): ``nvidia-smi nvlink --status`` and
``nvlink -e``, and the kernel log's ``NVRM: Xid`` lines that the host picked out of journalctl or dmesg.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# What the common Xids mean (NVIDIA's Xid catalogue, shortened) and who is usually at fault.
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception (often an application fault)",
    31: "GPU memory page fault (MMU fault; often an application's illegal address)",
    43: "GPU stopped processing (an application fault)",
    48: "double-bit ECC error (uncorrectable memory error)",
    63: "ECC page retirement or row remapping recorded (reset the GPU to apply)",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (the affected application must restart)",
    95: "uncontained ECC error (every application on the GPU is affected; reset the GPU)",
}
_GPU_HEAD = re.compile(r"^GPU (\d+):")
_LINK_STATE = re.compile(r"^\s*Link (\d+):\s*(.*?)\s*$")
_LINK_COUNTER = re.compile(r"^\s*Link (\d+):\s*([A-Za-z][A-Za-z0-9 _-]*?):\s*(\d+)\s*$")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]+:[0-9A-Fa-f]+(?::[0-9A-Fa-f]+)?)[^)]*\):\s*(\d+)\s*,?\s*(.*)$")
_PCI = re.compile(r"^(?:([0-9A-Fa-f]+):)?([0-9A-Fa-f]+):([0-9A-Fa-f]+)")


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool
    state: str  # "26.562 GB/s" or "<inactive>", as printed
    errors: dict[str, int] = field(default_factory=dict)  # "CRC Errors" -> count, from nvlink -e


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str | None  # "0000:3b:00" as the driver names the GPU
    time: float | None  # Unix time; None when the log gave no usable time
    text: str  # the rest of the line: what the driver said

    @property
    def meaning(self) -> str:
        return XID_MEANINGS.get(self.xid, "see NVIDIA's Xid catalogue")


@dataclass
class KernelLog:
    """The Xid lines of the host's kernel log since boot; ``error`` when it could not be read."""

    source: str | None = None  # "journalctl -k", "dmesg", "sudo -n dmesg"
    xids: list[XidEvent] = field(default_factory=list)
    error: str | None = None
    unparsed: list[str] = field(default_factory=list)


def pci_key(address: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of "00000000:3B:00.0" or "0000:3b:00": the same GPU in XML and Xid lines."""
    m = _PCI.match(address or "")
    if not m:
        return None
    return int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16)


def _per_gpu(text: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    current: int | None = None
    for line in text.splitlines():
        head = _GPU_HEAD.match(line)
        if head:
            current = int(head.group(1))
            found.setdefault(current, [])
        elif current is not None and line.strip():
            found[current].append(line)
    return found


def parse_nvlink_status(text: str) -> dict[int, list[NvLink]]:
    """``nvidia-smi nvlink --status``: GPU index -> its links. Empty output: no NVLink on this host."""
    out: dict[int, list[NvLink]] = {}
    for gpu, lines in _per_gpu(text).items():
        links = []
        for line in lines:
            m = _LINK_STATE.match(line)
            if m:
                state = m.group(2)
                links.append(NvLink(int(m.group(1)), "inactive" not in state.lower() and state != "", state))
        if links:
            out[gpu] = links
    return out


def parse_nvlink_errors(text: str) -> dict[int, dict[int, dict[str, int]]]:
    """``nvidia-smi nvlink -e``: GPU index -> link -> counter name -> count."""
    out: dict[int, dict[int, dict[str, int]]] = {}
    for gpu, lines in _per_gpu(text).items():
        for line in lines:
            m = _LINK_COUNTER.match(line)
            if m:
                out.setdefault(gpu, {}).setdefault(int(m.group(1)), {})[m.group(2).strip()] = int(m.group(3))
    return out


def _ran(result: dict[str, Any] | None) -> tuple[str, str | None]:
    if not result:
        return "", None
    if result.get("rc") != 0:
        why = result.get("error") or ((result.get("stderr") or result.get("stdout") or "").strip().splitlines()
                                      or ["no output"])[0]
        return "", f"`{' '.join(result.get('argv') or ['nvidia-smi nvlink'])[-60:]}` failed: {why}"
    return str(result.get("stdout") or ""), None


def parse_nvlink(status: dict[str, Any] | None,
                 errors: dict[str, Any] | None) -> tuple[dict[int, list[NvLink]], str | None]:
    """The host's two nvlink captures -> (GPU index -> links with their error counters, error)."""
    status_text, status_error = _ran(status)
    if status_error:
        return {}, status_error
    links = parse_nvlink_status(status_text)
    errors_text, errors_error = _ran(errors)
    counters = parse_nvlink_errors(errors_text)
    merged = {gpu: [NvLink(lk.link, lk.active, lk.state, counters.get(gpu, {}).get(lk.link, {})) for lk in ls]
              for gpu, ls in links.items()}
    return merged, errors_error


def parse_xid_line(text: str, when: float | None) -> XidEvent | None:
    m = _XID.search(text)
    if not m:
        return None
    return XidEvent(int(m.group(2)), m.group(1).lower(), when, m.group(3).strip())


def parse_kernel_log(raw: dict[str, Any] | None) -> KernelLog:
    """The host's ``kernel_log`` answer (lines it picked by "NVRM: Xid") -> KernelLog."""
    if not raw:
        return KernelLog(error="the kernel log was not read")
    log = KernelLog(source=raw.get("source"), error=raw.get("error"))
    for line in raw.get("lines") or []:
        text = str(line.get("text") or "") if isinstance(line, dict) else str(line)
        when = line.get("time") if isinstance(line, dict) else None
        event = parse_xid_line(text, when if isinstance(when, int | float) else None)
        if event is None:
            log.unparsed.append(text[:200])
        else:
            log.xids.append(event)
    return log
