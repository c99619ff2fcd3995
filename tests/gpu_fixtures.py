"""The real H200 capture, and fault cases derived from it by changing exactly one value each.

The fault table is the one the fixtures README lists; ``derive`` changes the value in place (the
rest of the document stays byte-for-byte the capture) and checks that exactly one value changed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SMI = Path(__file__).parent / "fixtures" / "nvidia-smi"
H200 = SMI / "h200-xml"
H200_XML = (H200 / "nvidia-smi-q-x.xml").read_text()
H200_UUID = "GPU-28ae6ea3-f249-f5c0-a899-11761687074b"

# name -> (parent element, element, captured value, derived value, the rule it trips, level)
FAULTS: dict[str, tuple[str, str, str, str, str, str]] = {
    "ecc-volatile-dram-uncorrectable": ("volatile", "dram_uncorrectable", "0", "1", "ecc_uncorrectable", "red"),
    "ecc-aggregate-sram-secded": ("aggregate", "sram_uncorrectable_secded", "0", "2", "ecc_uncorrectable", "red"),
    "ecc-volatile-dram-correctable-1500": ("volatile", "dram_correctable", "0", "1500", "ecc_correctable", "amber"),
    "remap-pending": ("remapped_rows", "remapped_row_pending", "No", "Yes", "row_remapping", "red"),
    "remap-failure": ("remapped_rows", "remapped_row_failure", "No", "Yes", "row_remapping", "red"),
    "retired-pages-12": ("multiple_single_bit_retirement", "retired_count", "N/A", "12", "retired_pages", "amber"),
    "hw-thermal-slowdown": ("clocks_event_reasons", "clocks_event_reason_hw_thermal_slowdown", "Not Active",
                            "Active", "hw_slowdown", "red"),
    "hw-power-brake": ("clocks_event_reasons", "clocks_event_reason_hw_power_brake_slowdown", "Not Active",
                       "Active", "hw_slowdown", "red"),
    "sw-power-cap": ("clocks_event_reasons", "clocks_event_reason_sw_power_cap", "Not Active", "Active",
                     "power_cap", "amber"),
    "temperature-4c-from-slowdown": ("temperature", "gpu_temp_tlimit", "49 C", "2 C", "temperature", "amber"),
    "pcie-width-x8": ("link_widths", "current_link_width", "16x", "8x", "pcie_link", "amber"),
    "pcie-width-x4": ("link_widths", "current_link_width", "16x", "4x", "pcie_link", "red"),
    "pcie-gen4": ("pcie_gen", "current_link_gen", "5", "4", "pcie_link", "amber"),
    "pcie-gen2": ("pcie_gen", "current_link_gen", "5", "2", "pcie_link", "red"),
    "model-h100": ("gpu", "product_name", "NVIDIA H200", "NVIDIA H100 80GB HBM3", "gpu_model", "red"),
}
# The host vars every fault case is judged with (the capture itself is all green with them).
HOST_VARS: dict[str, Any] = {"gpus_expected": 1, "gpu_model": "H200"}


def derive(name: str, xml: str = H200_XML) -> str:
    """The capture with fault ``name``'s one value changed."""
    parent, tag, old, new, _, _ = FAULTS[name]
    start = xml.index(f"<{parent}>" if parent != "gpu" else "<gpu ")
    end = xml.index(f"</{parent}>", start)
    block = xml[start:end]
    changed, n = re.subn(rf"<{tag}>{re.escape(old)}</{tag}>", f"<{tag}>{new}</{tag}>", block, count=1)
    assert n == 1, f"{name}: <{tag}>{old}</{tag}> not found in <{parent}>"
    return xml[:start] + changed + xml[end:]


def ok(stdout: str) -> dict[str, Any]:
    return {"rc": 0, "stdout": stdout, "stderr": "", "error": None}


def raw_smi(xml: str = H200_XML, nvlink_status: str = "", nvlink_errors: str | None = None,
            kernel_lines: list[dict[str, Any]] | None = None, kernel_error: str | None = None) -> dict[str, Any]:
    """A facts ``nvidia_smi`` answer as the host sends it."""
    raw: dict[str, Any] = {"path": "/usr/local/nvidia/bin/nvidia-smi", "xml": ok(xml),
                           "nvlink_status": ok(nvlink_status),
                           "kernel_log": {"source": "dmesg", "lines": kernel_lines or [], "error": kernel_error}}
    if nvlink_errors is not None:
        raw["nvlink_errors"] = ok(nvlink_errors)
    return raw


def fake_nvidia_smi(xml_path: str, nvlink_status_path: str | None = None) -> str:
    """A shell script standing in for nvidia-smi: prints the files (``-q -x``, ``nvlink --status``)."""
    nvlink = f"cat {nvlink_status_path}" if nvlink_status_path else "true"
    return (f"#!/bin/sh\ncase \"$1 $2\" in\n  '-q -x') cat {xml_path} ;;\n  'nvlink --status') {nvlink} ;;\n"
            f"  *) echo \"fake nvidia-smi: $*\" >&2; exit 2 ;;\nesac\n")


FAKE_SMI_DIR = "/root/fake-nvidia-smi"  # on a lab host (its /root is its own)
FAKE_SMI = f"{FAKE_SMI_DIR}/nvidia-smi"


def install_fake_smi(lab: Any, host: str, xml: str, scratch: Path) -> None:
    """Put a fake nvidia-smi printing ``xml`` (and no NVLink) on a lab host, at FAKE_SMI."""
    local = scratch / f"fake-smi-{host}"
    local.mkdir(parents=True, exist_ok=True)
    (local / "q.xml").write_text(xml)
    (local / "nvlink.txt").write_text("")
    (local / "nvidia-smi").write_text(fake_nvidia_smi(f"{FAKE_SMI_DIR}/q.xml", f"{FAKE_SMI_DIR}/nvlink.txt"))
    lab.ssh(host, f"rm -rf {FAKE_SMI_DIR} && mkdir -p {FAKE_SMI_DIR}")
    done = lab.sftp(host, "".join(f"put {local / n} {FAKE_SMI_DIR}/{n}\n" for n in ("q.xml", "nvlink.txt",
                                                                                      "nvidia-smi")))
    assert done.returncode == 0, done.stderr
    lab.ssh(host, f"chmod 755 {FAKE_SMI}")


def remove_fake_smi(lab: Any, host: str) -> None:
    lab.ssh(host, f"rm -rf {FAKE_SMI_DIR}", check=False)


@contextmanager
def lab2_remapping_pending(lab: Any, scratch: Path) -> Iterator[Any]:
    """Every host's fake nvidia-smi prints the real capture, lab2's with a row remapping pending (a red
    host); removed at the end."""
    for host in lab.hosts:
        install_fake_smi(lab, host, derive("remap-pending") if host == "lab2" else H200_XML, scratch)
    try:
        yield lab
    finally:
        for host in lab.hosts:
            remove_fake_smi(lab, host)


# --- the synthetic 8x H200 HGX (fixtures/nvidia-smi/synthetic-hgx-h200-8x/, made by its make_fixtures.py) ---
HGX = SMI / "synthetic-hgx-h200-8x"
HGX_XML = (HGX / "nvidia-smi-q-x.xml").read_text()
HGX_SERVER_PID = 4242  # each GPU's scheduler (pid 4300 + index) is its child
# name -> (GPU index, parent element, [(element, captured, derived)], the rule it trips, level)
HGX_FAULTS: dict[str, tuple[int, str, list[tuple[str, str, str]], str, str]] = {
    "fabric-in-progress": (6, "fabric", [("state", "Completed", "In Progress"), ("status", "Success", "N/A"),
                                         ("cliqueId", "0", "N/A")], "fabric", "red"),
    "fabric-insufficient-resources": (2, "fabric", [("status", "Success", "Insufficient Resources")], "fabric",
                                      "red"),
    "fabric-unhealthy": (1, "health", [("summary", "Healthy", "Unhealthy")], "fabric", "red"),
    "fabric-bandwidth-degraded": (1, "health", [("bandwidth", "Full", "Degraded")], "fabric", "amber"),
    "persistence-off": (4, "gpu", [("persistence_mode", "Enabled", "Disabled")], "persistence", "amber"),
    "mig-enabled": (0, "mig_mode", [("current_mig", "Disabled", "Enabled"), ("pending_mig", "Disabled", "Enabled")],
                    "mig", "red"),
    "mig-pending": (7, "mig_mode", [("pending_mig", "Disabled", "Enabled")], "mig", "amber"),
}


def _gpu_span(xml: str, index: int) -> tuple[int, int]:
    starts = [m.start() for m in re.finditer(r"<gpu id=", xml)]
    return starts[index], xml.index("</gpu>", starts[index])


def hgx_derive(name: str, xml: str = HGX_XML) -> str:
    """The 8-GPU document with fault ``name``'s values changed in that one GPU."""
    index, parent, changes, _, _ = HGX_FAULTS[name]
    gpu_start, gpu_end = _gpu_span(xml, index)
    start = gpu_start if parent == "gpu" else xml.index(f"<{parent}>", gpu_start)
    end = gpu_end if parent == "gpu" else xml.index(f"</{parent}>", start)
    block = xml[start:end]
    for tag, old, new in changes:
        block, n = re.subn(rf"<{tag}>{re.escape(old)}</{tag}>", f"<{tag}>{new}</{tag}>", block, count=1)
        assert n == 1, f"{name}: <{tag}>{old}</{tag}> not found in GPU {index}'s <{parent}>"
    return xml[:start] + block + xml[end:]


def hgx_with_process(index: int, pid: int, name: str, mib: int, xml: str = HGX_XML) -> str:
    """GPU ``index`` also held by ``pid`` (a ``<process_info>`` in the driver's layout)."""
    gpu_start, _ = _gpu_span(xml, index)
    at = xml.index("\t\t</processes>", gpu_start)
    info = (f"\t\t\t<process_info>\n\t\t\t\t<gpu_instance_id>N/A</gpu_instance_id>\n\t\t\t\t<compute_instance_id>N/A"
            f"</compute_instance_id>\n\t\t\t\t<pid>{pid}</pid>\n\t\t\t\t<type>C</type>\n\t\t\t\t<process_name>{name}"
            f"</process_name>\n\t\t\t\t<used_memory>{mib} MiB</used_memory>\n\t\t\t</process_info>\n")
    return xml[:at] + info + xml[at:]


def hgx_owners(**extra: dict[str, Any]) -> dict[str, Any]:
    """The host's ``processes`` answer for the 8 schedulers (children of the server's pid), plus ``extra``."""
    pids: dict[str, Any] = {str(4300 + i): {"found": True, "ancestors": [HGX_SERVER_PID, 1], "unit": None}
                            for i in range(8)}
    return {"service_pids": [HGX_SERVER_PID], "pids": {**pids, **extra}}


def raw_hgx(xml: str = HGX_XML, topo: str | None = "topo-m.txt", **extra_owners: dict[str, Any]) -> dict[str, Any]:
    """A facts ``nvidia_smi`` answer of the 8x H200 host: XML, ``topo -m`` and the processes' owners."""
    raw = raw_smi(xml)
    if topo is not None:
        raw["topo"] = ok((HGX / topo).read_text())
    raw["processes"] = hgx_owners(**extra_owners)
    return raw
