"""GPU health rules over the real H200 capture: the capture is green, and every fault derived from it
by changing one value (tests/gpu_fixtures.py, listed in the fixtures README) is flagged by exactly its
rule. Plus NVLink, Xids, thresholds from host variables, and the host-side collection."""

from __future__ import annotations

import json
import runpy
import shutil
from pathlib import Path
from typing import Any

import pytest
from gpu_fixtures import FAULTS, H200, H200_XML, HOST_VARS, SMI, derive, fake_nvidia_smi, raw_smi

from fleetctl.errors import InputError
from fleetctl.gpu.health import HostHealth, Level, Thresholds, evaluate
from fleetctl.gpu.logs import XID_MEANINGS, parse_kernel_log, parse_nvlink_errors, parse_nvlink_status
from fleetctl.gpu.smi import parse_gpu_facts

REMOTE_FACTS = Path(__file__).parent.parent / "fleetctl" / "remote" / "facts.py"
NVLINK = SMI / "synthetic-nvlink"


def judge(raw: dict[str, Any], **host_vars: Any) -> HostHealth:
    return evaluate(parse_gpu_facts(raw), Thresholds.from_vars({**HOST_VARS, **host_vars}, "h"), "h")


def not_green(report: HostHealth) -> list[tuple[str, str]]:
    return [(c.rule, c.level.value) for g in report.gpus for c in g.checks if c.level is not Level.GREEN]


def test_the_real_capture_is_green_on_every_check() -> None:
    report = judge(raw_smi())
    assert report.level is Level.GREEN and not_green(report) == []
    rules = [c.rule for c in report.gpus[1].checks]
    assert rules == ["ecc_uncorrectable", "ecc_correctable", "row_remapping", "retired_pages", "hw_slowdown",
                     "power_cap", "temperature", "pcie_link", "nvlink", "xid", "fabric", "processes", "persistence",
                     "mig"]
    assert [c.rule for c in report.gpus[0].checks] == ["gpu_count", "gpu_model", "topology"]
    assert report.summary() == "green: 1 GPU, every check green"
    values = {c.rule: c.value for g in report.gpus for c in g.checks}  # what the capture says, N/A where it is
    assert (values["fabric"], values["processes"], values["persistence"], values["mig"]) == (
        "n/a (no NVLink fabric on this GPU)", "no process", "Enabled", "Disabled")
    assert values["topology"] == "1 GPU: no pair to connect"


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_derived_fault_is_flagged_by_exactly_its_rule(fault: str) -> None:
    xml = derive(fault)
    assert sum(a != b for a, b in zip(xml.splitlines(), H200_XML.splitlines(), strict=True)) == 1
    _, _, _, _, rule, level = FAULTS[fault]
    report = judge(raw_smi(xml))
    assert not_green(report) == [(rule, level)]
    assert report.level.value == level


def test_fault_values_are_shown() -> None:
    checks = {c.rule: c for g in judge(raw_smi(derive("remap-pending"))).gpus for c in g.checks}
    assert checks["row_remapping"].value.startswith("pending: yes, failure: no")
    pcie = {c.rule: c for g in judge(raw_smi(derive("pcie-width-x4"))).gpus for c in g.checks}["pcie_link"]
    assert pcie.value == "Gen5 x4 (max Gen5 x16) (red below x8 or Gen3)"
    temp = {c.rule: c for g in judge(raw_smi(derive("temperature-4c-from-slowdown"))).gpus for c in g.checks}
    assert temp["temperature"].value == "38 C, 4 C below slowdown (min 5)"


def test_gpu_count_and_missing_nvidia_smi() -> None:
    assert not_green(judge(raw_smi(), gpus_expected=8)) == [("gpu_count", "red")]
    assert judge(raw_smi(), gpus_expected=8).summary() == "red: host gpu_count (1 GPU(s), expected 8)"
    absent = evaluate(parse_gpu_facts(None), Thresholds(gpus_expected=8), "h")
    assert not_green(absent) == [("gpu_count", "red")]
    assert absent.gpus[0].checks[0].value == "0 GPU(s) (nvidia-smi not found), expected 8"
    no_gpu_host = evaluate(parse_gpu_facts(None), Thresholds(), "lab1")
    assert no_gpu_host.level is Level.GREEN and no_gpu_host.summary() == "green: 0 GPUs, every check green"
    broken = judge({"path": "x", "xml": {"rc": 9, "stdout": "NVIDIA-SMI has failed\n", "stderr": ""}})
    assert not_green(broken) == [("nvidia_smi", "red"), ("gpu_count", "red")]


def test_nvlink_all_up_one_down_and_noisy() -> None:
    status = (NVLINK / "nvlink-status.txt").read_text()
    errors = (NVLINK / "nvlink-errors.txt").read_text()
    links = parse_nvlink_status(status)
    assert sorted(links) == [0, 1] and len(links[0]) == 18 and all(lk.active for lk in links[0])
    assert parse_nvlink_errors(errors)[1][17] == {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}
    up = {c.rule: c for c in judge(raw_smi(nvlink_status=status, nvlink_errors=errors)).gpus[1].checks}
    assert (up["nvlink"].level, up["nvlink"].value) == (Level.GREEN, "18 links up")
    down = status.replace("\t Link 0: 26.562 GB/s", "\t Link 0: <inactive>", 1)
    down = down.replace("\t Link 5: 26.562 GB/s", "\t Link 5: <inactive>", 1)
    report = judge(raw_smi(nvlink_status=down, nvlink_errors=errors))
    assert not_green(report) == [("nvlink", "red")]
    assert report.gpus[1].checks[8].value == "2 of 18 links down: 0, 5"
    noisy = errors.replace("\t Link 3: CRC Errors: 0", "\t Link 3: CRC Errors: 250", 1)
    assert not_green(judge(raw_smi(nvlink_status=status, nvlink_errors=noisy))) == [("nvlink", "amber")]
    failed = raw_smi(nvlink_status=status)
    failed["nvlink_status"] = {"rc": 3, "stdout": "", "stderr": "Failed to get NVLink state\n",
                               "argv": ["nvidia-smi", "nvlink", "--status"]}
    assert not_green(judge(failed)) == [("nvlink", "amber")]


def _dmesg_lines() -> list[dict[str, Any]]:
    boot = 1_764_576_000.0  # 2025-12-01T08:00:00Z
    out = []
    for line in (SMI / "synthetic-xid" / "dmesg-lines.txt").read_text().splitlines():
        secs, _, text = line.partition("] ")
        out.append({"time": boot + float(secs.strip("[ ")), "text": text})
    return out


def test_xids_mapped_to_their_gpu_with_meanings() -> None:
    log = parse_kernel_log({"source": "dmesg", "lines": _dmesg_lines(), "error": None})
    assert [(e.xid, e.pci) for e in log.xids] == [(79, "0000:00:06"), (94, "0000:00:06"), (13, "0000:3b:00"),
                                                  (48, "0000:00:06")]
    report = judge(raw_smi(kernel_lines=_dmesg_lines()))
    assert not_green(report) == [("xid", "red"), ("xid", "red")]  # GPU 0's own, and 13 on a GPU not listed
    gpu0 = report.gpus[1].checks[9].value
    assert gpu0 == (f"Xid 48: {XID_MEANINGS[48]}; Xid 79: {XID_MEANINGS[79]}; Xid 94: {XID_MEANINGS[94]}")
    assert report.gpus[0].checks[-1].value == f"Xid 13: {XID_MEANINGS[13]}"
    assert sorted(XID_MEANINGS) == [13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95]


def test_xid_since_and_ignore_make_old_xids_green() -> None:
    after_all = "2025-12-01T12:00:00Z"
    assert not_green(judge(raw_smi(kernel_lines=_dmesg_lines()), gpu_xid_since=after_all)) == []
    between = 1_764_576_000.0 + 9001.5  # after the 79 and the 94
    partly = judge(raw_smi(kernel_lines=_dmesg_lines()), gpu_xid_since=between, gpu_xid_ignore=[13])
    assert partly.gpus[1].checks[9].value == f"Xid 48: {XID_MEANINGS[48]}"
    assert not_green(partly) == [("xid", "red")]


def test_unreadable_kernel_log_is_said_amber() -> None:
    report = judge(raw_smi(kernel_error="dmesg: exited 1: dmesg: read kernel buffer failed: Operation not permitted"))
    assert not_green(report) == [("xid", "amber")]
    assert report.gpus[1].checks[9].value.startswith("kernel log unreadable: dmesg: exited 1")


def test_thresholds_from_host_vars_and_their_errors() -> None:
    t = Thresholds.from_vars({"gpu_ecc_correctable_max": "50", "gpus_per_host": 8, "gpu_xid_ignore": "13, 43",
                              "gpu_xid_since": 1700000000}, "gpu01")
    assert (t.ecc_correctable_max, t.gpus_expected, t.xid_ignore, t.xid_since) == (50, 8, {13, 43}, 1.7e9)
    assert Thresholds.from_vars({}, "h") == Thresholds()
    with pytest.raises(InputError, match=r"^host gpu01: variable gpu_pcie_width_min: expected a whole number, "
                                         r"got 'wide'$"):
        Thresholds.from_vars({"gpu_pcie_width_min": "wide"}, "gpu01")
    with pytest.raises(InputError, match=r"^host gpu01: variable gpu_xid_since: expected a Unix time or an ISO"):
        Thresholds.from_vars({"gpu_xid_since": "yesterday"}, "gpu01")
    with pytest.raises(InputError, match=r"^host gpu01: variable gpu_model: not a regular expression"):
        Thresholds.from_vars({"gpu_model": "H200("}, "gpu01")
    amber = judge(raw_smi(derive("ecc-volatile-dram-correctable-1500")), gpu_ecc_correctable_max=2000)
    assert not_green(amber) == []


def test_report_json_fields() -> None:
    doc = json.loads(json.dumps(judge(raw_smi(derive("remap-pending"))).to_dict()))
    assert (doc["host"], doc["level"]) == ("h", "red")
    assert doc["summary"].startswith("red: GPU 0 row_remapping (pending: yes")
    gpu = doc["gpus"][1]
    assert (gpu["index"], gpu["name"], gpu["pci_bus_id"], gpu["level"]) == (0, "NVIDIA H200", "00000000:00:06.0",
                                                                            "red")
    assert {"rule": "row_remapping", "level": "red"}.items() <= gpu["checks"][2].items()
    assert doc["thresholds"]["gpus_expected"] == 1


# --- the host side: remote/facts.py with a fake nvidia-smi and a fake kernel log ------------------

def _script(path: Path, body: str) -> str:
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


def test_host_side_collects_xml_nvlink_and_xids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = _script(tmp_path / "nvidia-smi", fake_nvidia_smi(str(H200 / "nvidia-smi-q-x.xml"),
                                                           str(NVLINK / "nvlink-status.txt"))
                  .replace("  *)", f"  'nvlink -e') cat {NVLINK / 'nvlink-errors.txt'} ;;\n  *)"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lines = (SMI / "synthetic-xid" / "dmesg-lines.txt").read_text()
    _script(bin_dir / "dmesg", f"#!/bin/sh\necho '[    1.0] unrelated'\ncat <<'EOF'\n{lines}EOF\n")
    (bin_dir / "cat").symlink_to(shutil.which("cat") or "/bin/cat")
    monkeypatch.setenv("PATH", str(bin_dir))  # no journalctl: the fake dmesg is the kernel log
    facts = runpy.run_path(str(REMOTE_FACTS))
    answer = facts["main"]({"nvidia_smi": smi, "gpu_only": True, "gpu_health": True})["nvidia_smi"]
    assert answer["xml"]["rc"] == 0 and "<supported_clocks>" not in answer["xml"]["stdout"]
    assert "<supported_clocks>" in H200_XML and len(answer["xml"]["stdout"]) < len(H200_XML) / 2
    assert answer["nvlink_errors"]["argv"][1:] == ["nvlink", "-e"]
    assert answer["kernel_log"]["source"] == "dmesg"
    texts = [line["text"] for line in answer["kernel_log"]["lines"]]
    assert len(texts) == 4 and all(t.startswith("NVRM: Xid") for t in texts)  # "unrelated" left out
    times = [line["time"] for line in answer["kernel_log"]["lines"]]
    assert times == sorted(times) and times[1] - times[0] == pytest.approx(9001.000001 - 8123.456789)
    parsed = parse_gpu_facts(answer)
    assert sorted(parsed.nvlink) == [0, 1] and parsed.nvlink[0][0].errors["CRC Errors"] == 0
    assert parsed.kernel_log is not None and parsed.kernel_log.error is None


def test_host_side_unreadable_kernel_log_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "dmesg", "#!/bin/sh\necho 'dmesg: read kernel buffer failed: Operation not permitted' >&2\n"
                               "exit 1\n")
    _script(bin_dir / "journalctl", "#!/bin/sh\necho 'No journal files were opened due to insufficient "
                                    "permissions.' >&2\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    facts = runpy.run_path(str(REMOTE_FACTS))
    log = facts["kernel_log"]()
    assert log["source"] is None and log["lines"] == []
    assert log["error"].startswith("journalctl -k: No journal files were opened due to insufficient permissions.; "
                                   "dmesg: exited 1: dmesg: read kernel buffer failed: Operation not permitted")
    gpu_only = facts["main"]({"gpu_only": True, "nvidia_smi": str(bin_dir / "none")})["nvidia_smi"]
    assert gpu_only["xml"]["rc"] is None and "kernel_log" not in gpu_only  # drift and kernels skip health


def test_host_side_journalctl_times(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "journalctl", "#!/bin/sh\necho '1764580000.123456 h kernel: something else'\n"
                                    "echo '1764580001.5 h kernel: NVRM: Xid (PCI:0000:00:06): 63, pid=0, Row "
                                    "Remapper: New row marked for remapping'\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    log = runpy.run_path(str(REMOTE_FACTS))["kernel_log"]()
    assert log["source"] == "journalctl -k"
    assert log["lines"] == [{"time": 1764580001.5, "text": "h kernel: NVRM: Xid (PCI:0000:00:06): 63, pid=0, Row "
                                                           "Remapper: New row marked for remapping"}]
    parsed = parse_kernel_log(log)
    assert [(e.xid, e.time, e.meaning) for e in parsed.xids] == [(63, 1764580001.5, XID_MEANINGS[63])]
