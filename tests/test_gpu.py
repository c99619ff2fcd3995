"""nvidia-smi parsing, on real H200 captures and on synthetic edge cases (see fixtures README)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fleetctl.gpu import (
    GpuFacts,
    GpuInfo,
    describe_gpus,
    parse_gpu_facts,
    parse_header,
    parse_query_csv,
    parse_query_line,
    sglang_device_name,
)

FIXTURES = Path(__file__).parent / "fixtures"
SMI = FIXTURES / "nvidia-smi"
H200_UUID = "GPU-769674e0-b2ae-647b-425a-f9a790ac69f7"
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
DRIVER_FAILURE = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


def _ok(stdout: str) -> dict[str, Any]:
    return {"rc": 0, "stdout": stdout, "stderr": "", "error": None}


def _raw(folder: str) -> dict[str, Any]:
    """A facts ``nvidia_smi`` object built from one fixture folder."""
    return {
        "path": "/usr/bin/nvidia-smi",
        "query": _ok((SMI / folder / "query-gpu.csv").read_text()),
        "header": _ok((SMI / folder / "nvidia-smi.txt").read_text()),
    }


# --- real H200 capture -------------------------------------------------------------------------

def test_h200_query_row_has_the_captured_values() -> None:
    gpus, bad = parse_query_csv((SMI / "h200" / "query-gpu.csv").read_text())
    assert bad == []
    assert gpus == [GpuInfo(
        index=0, name="NVIDIA H200", uuid=H200_UUID, memory_mib=143771, driver_version="580.159.04",
        compute_capability="9.0", persistence_mode=True, mig_mode="Disabled", pci_bus_id="00000000:00:06.0",
    )]
    assert gpus[0].sglang_name == "NVIDIA_H200"


def test_h200_header_gives_driver_and_cuda() -> None:
    assert parse_header((SMI / "h200" / "nvidia-smi.txt").read_text()) == ("580.159.04", "13.0")


def test_h200_facts_and_summary_line() -> None:
    facts = parse_gpu_facts(_raw("h200"))
    assert facts.error is None
    assert (facts.count, facts.driver_version, facts.cuda_version) == (1, "580.159.04", "13.0")
    assert describe_gpus(facts) == "1x NVIDIA H200 (143771 MiB), driver 580.159.04, CUDA 13.0"


def test_h200_query_agrees_with_list_and_full_query() -> None:
    """The -L and -q captures of the same machine say the same thing as the CSV query."""
    gpu = parse_query_csv((SMI / "h200" / "query-gpu.csv").read_text())[0][0]
    assert (SMI / "h200" / "nvidia-smi-L.txt").read_text().strip() == f"GPU 0: {gpu.name} (UUID: {gpu.uuid})"
    q = (SMI / "h200" / "nvidia-smi-q.txt").read_text()
    assert re.search(r"Product Name\s+: NVIDIA H200$", q, re.MULTILINE)
    assert re.search(r"CUDA Version\s+: 13\.0$", q, re.MULTILINE)
    assert re.search(r"Driver Version\s+: 580\.159\.04$", q, re.MULTILINE)


def test_h200_facts_json_capture_parses_like_the_text_fixtures() -> None:
    raw = json.loads((FIXTURES / "facts" / "h200-facts.json").read_text())
    assert raw["nvidia_smi"]["query"]["rc"] == 0
    assert parse_gpu_facts(raw["nvidia_smi"]).gpus == parse_gpu_facts(_raw("h200")).gpus


# --- synthetic 8x RTX PRO 6000 Blackwell --------------------------------------------------------

def test_rtx_pro_6000_eight_gpus_with_mig_not_applicable() -> None:
    facts = parse_gpu_facts(_raw("rtx-pro-6000-8x"))
    assert facts.error is None
    assert [g.index for g in facts.gpus] == list(range(8))
    assert {g.name for g in facts.gpus} == {RTX}  # GPU 3's padded cells are stripped
    assert {g.memory_mib for g in facts.gpus} == {97887}
    assert {g.compute_capability for g in facts.gpus} == {"12.0"}
    assert {g.mig_mode for g in facts.gpus} == {None}  # both "[N/A]" and "N/A"
    assert [g.persistence_mode for g in facts.gpus] == [True, True, True, False, True, True, None, True]
    assert facts.gpus[3].pci_bus_id == "00000000:61:00.0"
    assert (facts.driver_version, facts.cuda_version) == ("575.57.08", "12.9")
    assert describe_gpus(facts) == f"8x {RTX} (97887 MiB), driver 575.57.08, CUDA 12.9"


def test_sglang_device_name_replaces_spaces_only() -> None:
    assert sglang_device_name("NVIDIA H200") == "NVIDIA_H200"
    assert sglang_device_name(RTX) == "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"
    assert sglang_device_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"


# --- failures and odd output -------------------------------------------------------------------

def test_nvidia_smi_absent_means_no_gpu_not_an_error() -> None:
    facts = parse_gpu_facts(None)
    assert facts == GpuFacts()
    assert describe_gpus(facts) == "no GPU (nvidia-smi not found)"


def test_driver_failure_is_reported_from_stdout() -> None:
    folder = SMI / "driver-failure"
    failed = {"rc": int((folder / "rc").read_text()), "stdout": (folder / "stdout.txt").read_text(),
              "stderr": "", "error": None}
    facts = parse_gpu_facts({"path": "/usr/bin/nvidia-smi", "query": failed, "header": failed})
    assert facts.gpus == []
    assert facts.error is not None and facts.error.startswith(f"nvidia-smi exited 9: {DRIVER_FAILURE}")
    assert facts.cuda_version is None
    assert describe_gpus(facts).startswith("no GPU: nvidia-smi exited 9: NVIDIA-SMI has failed")


def test_timeout_and_no_devices() -> None:
    timed_out = {"rc": None, "stdout": "", "stderr": "", "error": "timed out after 20s"}
    facts = parse_gpu_facts({"path": "/usr/bin/nvidia-smi", "query": timed_out, "header": timed_out})
    assert facts.error == "nvidia-smi did not run: timed out after 20s"
    none = {"rc": 6, "stdout": "No devices were found\n", "stderr": "", "error": None}
    assert parse_gpu_facts({"path": "x", "query": none, "header": none}).error == (
        "nvidia-smi exited 6: No devices were found"
    )
    empty = parse_gpu_facts({"path": "x", "query": _ok("\n"), "header": _ok("")})
    assert empty.error == "nvidia-smi listed no GPUs"


def test_bad_lines_are_reported_good_ones_kept() -> None:
    text = "0, NVIDIA H200, GPU-1, 143771, 580.159.04, 9.0, Enabled, Disabled, 00000000:00:06.0\n" \
           "Unable to determine the device handle for GPU1: 0000:1B:00.0: Unknown Error\n"
    facts = parse_gpu_facts({"path": "x", "query": _ok(text), "header": _ok("")})
    assert [g.uuid for g in facts.gpus] == ["GPU-1"]
    assert facts.error is not None and "Unable to determine the device handle" in facts.error
    assert describe_gpus(facts).startswith("1x NVIDIA H200 (143771 MiB), driver 580.159.04 [unparsed")


@pytest.mark.parametrize("line", [
    "", "index, name", "x, NVIDIA H200, a, 1, 2, 3, Enabled, Disabled, b",
    "0, [N/A], a, 1, 2, 3, Enabled, Disabled, b", "0, A, B, C, D, E, F, G, H, I",
])
def test_malformed_rows_are_rejected(line: str) -> None:
    assert parse_query_line(line) is None


def test_missing_markers_and_units_are_normalised() -> None:
    gpu = parse_query_line("1,NVIDIA A100-SXM4-80GB,[N/A],81920 MiB,[Not Supported],  8.0 ,On,N/A,[Unknown Error]")
    assert gpu == GpuInfo(
        index=1, name="NVIDIA A100-SXM4-80GB", uuid=None, memory_mib=81920, driver_version=None,
        compute_capability="8.0", persistence_mode=True, mig_mode=None, pci_bus_id=None,
    )
    odd = parse_query_line("2, X, u, [N/A], d, 9.0, Weird, Enabled, p")
    assert odd is not None and (odd.memory_mib, odd.persistence_mode, odd.mig_mode) == (None, None, "Enabled")


def test_mixed_models_summary() -> None:
    text = "\n".join(
        f"{i}, {name}, GPU-{i}, {mib}, 570.133.20, 9.0, Enabled, Disabled, 0000:{i}"
        for i, (name, mib) in enumerate([("NVIDIA H200", 143771)] * 2 + [("NVIDIA H100 80GB HBM3", 81559)])
    )
    facts = parse_gpu_facts({"path": "x", "query": _ok(text), "header": _ok("CUDA Version: 12.8")})
    assert describe_gpus(facts) == (
        "2x NVIDIA H200 (143771 MiB) + 1x NVIDIA H100 80GB HBM3 (81559 MiB), driver 570.133.20, CUDA 12.8"
    )
    assert facts.to_dict()["gpus"][2]["name"] == "NVIDIA H100 80GB HBM3"
