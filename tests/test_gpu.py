"""nvidia-smi -q -x parsing, on the real H200 capture and on synthetic edge cases (see fixtures README)."""

from __future__ import annotations

import json
import re
from typing import Any

from gpu_fixtures import H200, H200_UUID, H200_XML, SMI, ok, raw_smi

from fleetctl.gpu.smi import GpuFacts, compute_capability, describe_gpus, parse_gpu_facts, parse_xml, sglang_device_name

RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
DRIVER_FAILURE = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


# --- the real H200 capture ---------------------------------------------------------------------

def test_h200_xml_gives_the_facts_the_csv_query_gave() -> None:
    gpus, driver, cuda = parse_xml(H200_XML)
    assert (driver, cuda) == ("580.159.04", "13.0")
    [gpu] = gpus
    assert (gpu.index, gpu.name, gpu.uuid, gpu.memory_mib, gpu.driver_version) == (
        0, "NVIDIA H200", H200_UUID, 143771, "580.159.04")
    assert (gpu.compute_capability, gpu.persistence_mode, gpu.mig_mode, gpu.pci_bus_id) == (
        "9.0", True, "Disabled", "00000000:00:06.0")
    assert (gpu.architecture, gpu.serial, gpu.vbios_version, gpu.inforom_version, gpu.gsp_firmware_version) == (
        "Hopper", "1654024077075", "96.00.A5.00.1A", "G520.0282.02.02", "580.159.04")
    assert gpu.sglang_name == "NVIDIA_H200"


def test_h200_health_readings_as_captured() -> None:
    r = parse_xml(H200_XML)[0][0].readings
    assert r.ecc_mode == "Enabled"
    assert (r.ecc_volatile_correctable, r.ecc_volatile_uncorrectable) == (0, 0)
    assert (r.ecc_aggregate_correctable, r.ecc_aggregate_uncorrectable) == (0, 0)
    assert (r.remap_pending, r.remap_failure, r.remapped_correctable, r.remapped_uncorrectable) == (False, False, 0, 0)
    assert (r.retired_single_bit, r.retired_double_bit, r.retired_pending) == (None, None, None)  # N/A on Hopper
    assert r.clock_events["gpu_idle"] is True and not any(v for k, v in r.clock_events.items() if k != "gpu_idle")
    assert (r.temperature_c, r.slowdown_margin_c) == (38, 51)  # T.Limit 49 C, slowdown at -2 C
    assert (r.power_draw_w, r.power_limit_w, r.performance_state) == (103.53, 700.0, "P0")
    assert (r.pcie_gen_current, r.pcie_gen_max, r.pcie_width_current, r.pcie_width_max) == (5, 5, 16, 16)


def test_h200_xml_agrees_with_the_text_capture_of_the_same_minute() -> None:
    """nvidia-smi -q (text) captured right after -q -x on the same machine says the same thing."""
    q = (H200 / "nvidia-smi-q.txt").read_text()
    gpu = parse_xml(H200_XML)[0][0]
    for label, value in [("Product Name", gpu.name), ("GPU UUID", gpu.uuid), ("VBIOS Version", gpu.vbios_version),
                         ("Driver Version", gpu.driver_version), ("CUDA Version", "13.0"),
                         ("Bus Id", gpu.pci_bus_id), ("Image Version", gpu.inforom_version),
                         ("Pending", "No"), ("Remapping Failure Occurred", "No")]:
        assert re.search(rf"^\s*{re.escape(label)}\s+: {re.escape(str(value))}\s*$", q, re.MULTILINE), label


def test_h200_facts_summary_no_nvlink_no_xid() -> None:
    facts = parse_gpu_facts(raw_smi())
    assert facts.error is None and facts.nvlink == {} and facts.nvlink_error is None
    assert facts.kernel_log is not None and facts.kernel_log.xids == [] and facts.kernel_log.source == "dmesg"
    assert describe_gpus(facts) == "1x NVIDIA H200 (143771 MiB), driver 580.159.04, CUDA 13.0"
    assert json.loads(json.dumps(facts.to_dict()))["gpus"][0]["readings"]["pcie_width_max"] == 16


def test_h200_raw_facts_answer_captured_by_fleetctl_on_the_device() -> None:
    """remote/facts.py's own answer on the real H200 (the XML as the host trims it, nvlink, dmesg)."""
    raw = json.loads((H200 / "fleetctl-run" / "raw-facts.json").read_text())
    smi = raw["nvidia_smi"]
    assert smi["xml"]["argv"][1:] == ["-q", "-x"] and "<supported_clocks>" not in smi["xml"]["stdout"]
    assert smi["nvlink_status"]["stdout"] == "" and "nvlink_errors" not in smi  # no NVLink: -e not run
    assert smi["kernel_log"] == {"source": "dmesg", "lines": [], "error": None}
    facts = parse_gpu_facts(smi)
    assert facts.error is None and [g.name for g in facts.gpus] == ["NVIDIA H200"]


# --- synthetic 8x RTX PRO 6000 Blackwell --------------------------------------------------------

def test_rtx_pro_6000_eight_gpus() -> None:
    facts = parse_gpu_facts(raw_smi((SMI / "rtx-pro-6000-8x" / "nvidia-smi-q-x.xml").read_text()))
    assert facts.error is None
    assert [g.index for g in facts.gpus] == list(range(8))
    assert {g.name for g in facts.gpus} == {RTX} and {g.memory_mib for g in facts.gpus} == {97887}
    assert {g.compute_capability for g in facts.gpus} == {"12.0"}
    assert {g.mig_mode for g in facts.gpus} == {None}
    assert [g.persistence_mode for g in facts.gpus] == [True, True, True, False, True, True, None, True]
    assert facts.gpus[3].pci_bus_id == "00000000:61:00.0"
    assert (facts.driver_version, facts.cuda_version) == ("575.57.08", "12.9")
    r = facts.gpus[0].readings
    assert (r.ecc_mode, r.ecc_volatile_uncorrectable, r.slowdown_margin_c) == ("Disabled", None, 92 - 33)
    assert describe_gpus(facts) == f"8x {RTX} (97887 MiB), driver 575.57.08, CUDA 12.9"
    assert facts.versions("vbios_version") == "98.02.55.00.03"


def test_older_driver_element_names_are_read() -> None:
    """Before R535: single_bit/double_bit ECC totals, clocks_throttle_reasons, absolute slowdown temp."""
    old = ("<nvidia_smi_log><driver_version>470.82.01</driver_version><cuda_version>11.4</cuda_version>"
           "<gpu id='00000000:3B:00.0'><product_name>Tesla V100-SXM2-32GB</product_name>"
           "<product_architecture>Volta</product_architecture><fb_memory_usage><total>32510 MiB</total>"
           "</fb_memory_usage><ecc_errors><volatile><single_bit><total>3</total></single_bit><double_bit>"
           "<total>1</total></double_bit></volatile></ecc_errors><retired_pages><multiple_single_bit_retirement>"
           "<retired_count>2</retired_count></multiple_single_bit_retirement><pending_retirement>Yes"
           "</pending_retirement></retired_pages><clocks_throttle_reasons><clocks_throttle_reason_hw_slowdown>"
           "Active</clocks_throttle_reason_hw_slowdown></clocks_throttle_reasons><temperature><gpu_temp>80 C"
           "</gpu_temp><gpu_temp_slow_threshold>84 C</gpu_temp_slow_threshold></temperature></gpu></nvidia_smi_log>")
    [gpu], driver, _ = parse_xml(old)
    r = gpu.readings
    assert (gpu.compute_capability, gpu.pci_bus_id, driver) == ("7.0", "00000000:3B:00.0", "470.82.01")
    assert (r.ecc_volatile_correctable, r.ecc_volatile_uncorrectable, r.retired_single_bit) == (3, 1, 2)
    assert r.retired_pending is True and r.clock_events == {"hw_slowdown": True} and r.slowdown_margin_c == 4


def test_compute_capability_from_architecture_and_name() -> None:
    assert compute_capability("Hopper", "NVIDIA H200") == "9.0"
    assert compute_capability("Blackwell", "NVIDIA B200") == "10.0"
    assert compute_capability("Blackwell", RTX) == "12.0"
    assert compute_capability("Ampere", "NVIDIA A100-SXM4-80GB") == "8.0"
    assert compute_capability("Ampere", "NVIDIA A10G") == "8.6"
    assert compute_capability(None, "Some Future GPU") is None


def test_sglang_device_name_replaces_spaces_only() -> None:
    assert sglang_device_name("NVIDIA H200") == "NVIDIA_H200"
    assert sglang_device_name(RTX) == "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"


# --- failures and odd output -------------------------------------------------------------------

def test_nvidia_smi_absent_means_no_gpu_not_an_error() -> None:
    facts = parse_gpu_facts(None)
    assert facts == GpuFacts()
    assert describe_gpus(facts) == "no GPU (nvidia-smi not found)"


def test_driver_failure_is_reported_from_stdout() -> None:
    folder = SMI / "driver-failure"
    failed: dict[str, Any] = {"rc": int((folder / "rc").read_text()), "stdout": (folder / "stdout.txt").read_text(),
                              "stderr": "", "error": None}
    facts = parse_gpu_facts({"path": "/usr/bin/nvidia-smi", "xml": failed})
    assert facts.gpus == [] and facts.cuda_version is None
    assert facts.error is not None and facts.error.startswith(f"nvidia-smi exited 9: {DRIVER_FAILURE}")
    assert describe_gpus(facts).startswith("no GPU: nvidia-smi exited 9: NVIDIA-SMI has failed")


def test_timeout_not_xml_truncated_and_no_devices() -> None:
    timed_out = {"rc": None, "stdout": "", "stderr": "", "error": "timed out after 20s"}
    assert parse_gpu_facts({"path": "x", "xml": timed_out}).error == "nvidia-smi did not run: timed out after 20s"
    none = {"rc": 6, "stdout": "No devices were found\n", "stderr": "", "error": None}
    assert parse_gpu_facts({"path": "x", "xml": none}).error == "nvidia-smi exited 6: No devices were found"
    bad = parse_gpu_facts({"path": "x", "xml": ok("<nvidia_smi_log><gpu>")}).error
    assert bad is not None and bad.startswith("nvidia-smi -q -x printed no readable XML (no element found: line 1")
    assert parse_gpu_facts({"path": "x", "xml": ok("<html/>")}).error == (
        "nvidia-smi -q -x printed <html>, not <nvidia_smi_log>")
    cut = parse_gpu_facts({"path": "x", "xml": {**ok(H200_XML[:500]), "truncated": True}}).error
    assert cut == "nvidia-smi -q -x output was cut at the host's size limit"
    empty = parse_gpu_facts({"path": "x", "xml": ok("<nvidia_smi_log></nvidia_smi_log>")})
    assert empty.error == "nvidia-smi listed no GPUs"


def test_mixed_models_summary_and_versions() -> None:
    two = H200_XML.replace("</nvidia_smi_log>", "") + H200_XML[H200_XML.index("<gpu "):].replace(
        "NVIDIA H200", "NVIDIA H100 80GB HBM3").replace("96.00.A5.00.1A", "96.00.99.00.01")
    facts = parse_gpu_facts(raw_smi(two))
    assert [g.index for g in facts.gpus] == [0, 1]
    assert describe_gpus(facts) == ("1x NVIDIA H200 (143771 MiB) + 1x NVIDIA H100 80GB HBM3 (143771 MiB), "
                                    "driver 580.159.04, CUDA 13.0")
    assert facts.versions("vbios_version") == "96.00.99.00.01 + 96.00.A5.00.1A"
