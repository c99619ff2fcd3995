"""The HGX rules (topology, fabric, processes, persistence, MIG) over the SYNTHETIC 8x H200 fixtures
(tests/fixtures/nvidia-smi/synthetic-hgx-h200-8x/, see its README row): the healthy host is green,
each fault is flagged by exactly its rule, naming the GPU or the pair. Plus the host side: ``topo -m``
only with 2 GPUs or more, and the GPU processes' ancestors read from the real /proc."""

from __future__ import annotations

import os
import runpy
import subprocess
from pathlib import Path
from typing import Any

import gpu_fixtures
import pytest
from gpu_fixtures import H200, HGX, HGX_FAULTS, HGX_XML, SMI, fake_nvidia_smi, hgx_derive, ok, raw_hgx, raw_smi

from fleetctl.errors import InputError
from fleetctl.gpu import hgx
from fleetctl.gpu.health import HostHealth, Level, Thresholds, evaluate
from fleetctl.gpu.smi import parse_gpu_facts
from fleetctl.gpu.topo import parse_topo

HGX_VARS: dict[str, Any] = {"gpus_expected": 8, "gpu_model": "H200"}
REMOTE_FACTS = Path(__file__).parent.parent / "fleetctl" / "remote" / "facts.py"


def judge(raw: dict[str, Any], **host_vars: Any) -> HostHealth:
    return evaluate(parse_gpu_facts(raw), Thresholds.from_vars({**HGX_VARS, **host_vars}, "hgx1"), "hgx1")


def problems(report: HostHealth) -> list[tuple[int | None, str, str, str]]:
    return [(g.index, c.rule, c.level.value, c.value) for g in report.gpus for c in g.checks
            if c.level is not Level.GREEN]


def checks_of(report: HostHealth, rule: str) -> list[str]:
    return [c.value for g in report.gpus for c in g.checks if c.rule == rule]


def test_the_healthy_hgx_host_is_green_on_every_check() -> None:
    report = judge(raw_hgx())
    assert problems(report) == [] and report.summary() == "green: 8 GPUs, every check green"
    assert checks_of(report, "topology") == ["all 28 GPU pairs NV18 (NVIDIA H200 is an NVSwitch board)"]
    assert checks_of(report, "fabric")[0] == ("Completed, Success, health Healthy, bandwidth Full "
                                              "(clique 0, cluster 00000000-0000-0000-0000-000000000000)")
    assert checks_of(report, "processes") == ["1 of the release's server (130842 MiB)"] * 8


def test_topo_matrix_parsed_with_its_affinities_and_legends() -> None:
    text = (HGX / "topo-m.txt").read_text()
    assert text.startswith("\t\x1b[4mGPU0\t")  # the driver's underline, kept in the fixture
    topo = parse_topo(text)
    assert topo.gpus == list(range(8)) and len(topo.links) == 28 and set(topo.links.values()) == {"NV18"}
    assert topo.affinity[5] == {"CPU Affinity": "56-111,168-223", "NUMA Affinity": "1", "GPU NUMA ID": "N/A"}
    assert topo.nics["NIC3"] == "mlx5_3" and topo.legend["NV#"] == "Connection traversing a bonded set of # NVLinks"
    pcie = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tPHB\t0-63\t0\t\tN/A\n" \
           "GPU1\tPHB\t X \t0-63\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n"
    assert parse_topo(pcie).links == {"0-1": "PHB"}
    with pytest.raises(ValueError, match="no matrix"):
        parse_topo("No devices were found\n")


def test_a_degraded_gpu_names_each_of_its_pairs() -> None:
    report = judge(raw_hgx(topo="topo-m-gpu5-degraded.txt"))
    assert [(i, rule, level) for i, rule, level, _ in problems(report)] == [(None, "topology", "red")]
    assert checks_of(report, "topology") == [
        "7 of 28 GPU pairs not NV18: GPU0-GPU5: NV16; GPU1-GPU5: NV16; GPU2-GPU5: NV16; GPU3-GPU5: NV16; "
        "GPU4-GPU5: NV16; GPU5-GPU6: NV16 (+1 more) (NVIDIA H200 is an NVSwitch board)"]


def test_a_pair_over_pcie_where_nvlink_is_expected() -> None:
    text = (HGX / "topo-m.txt").read_text().splitlines(keepends=True)
    for row, col in ((3, 7), (7, 3)):  # GPU2 <-> GPU6 over the SMP interconnect
        cells = text[row].split("\t")
        cells[col] = "SYS"
        text[row] = "\t".join(cells)
    raw = raw_hgx()
    raw["topo"] = ok("".join(text))
    report = judge(raw)
    assert checks_of(report, "topology") == [
        "1 of 28 GPU pairs not NV18: GPU2-GPU6: SYS (NVIDIA H200 is an NVSwitch board)"]
    assert not [p for p in problems(judge(raw, gpu_nvlink_expected=False)) if p[1] == "topology"]
    per_pair = judge(raw_hgx(), gpu_nvlink_per_pair=12)  # an operator's count is the one checked
    assert checks_of(per_pair, "topology")[0].startswith("28 of 28 GPU pairs not NV12: GPU0-GPU1: NV18")


def test_topology_of_pcie_cards_and_unreadable_topo() -> None:
    rtx = (SMI / "rtx-pro-6000-8x" / "nvidia-smi-q-x.xml").read_text()
    pcie = "".join(f"GPU{i}\t" + "\t".join(" X " if i == j else "SYS" if i // 4 != j // 4 else "NODE"
                                           for j in range(8)) + "\t0-31\t0\t\tN/A\n" for i in range(8))
    raw = raw_smi(rtx)
    raw["topo"] = ok("\t" + "\t".join(f"GPU{i}" for i in range(8)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
                     + pcie)
    facts = parse_gpu_facts(raw)
    green = evaluate(facts, Thresholds(), "rtx")
    assert [c.value for c in green.gpus[0].checks if c.rule == "topology"] == [
        "28 GPU pairs: 16 SYS, 12 NODE (not an NVSwitch board (set gpu_nvlink_expected to check))"]
    red = evaluate(facts, Thresholds(nvlink_expected=True), "rtx")
    assert [c.value for c in red.gpus[0].checks if c.rule == "topology"][0].startswith(
        "28 of 28 GPU pairs not NV#: GPU0-GPU1: NODE")
    failed = raw_hgx()
    failed["topo"] = {"rc": 3, "stdout": "", "stderr": "Failed to get topology\n", "error": None}
    assert [(p[1], p[2], p[3]) for p in problems(judge(failed))] == [
        ("topology", "amber", "unreadable: nvidia-smi topo -m exited 3: Failed to get topology")]


@pytest.mark.parametrize("fault", sorted(HGX_FAULTS))
def test_each_hgx_fault_is_flagged_by_exactly_its_rule_on_its_gpu(fault: str) -> None:
    index, _, _, rule, level = HGX_FAULTS[fault]
    report = judge(raw_hgx(hgx_derive(fault)))
    assert [(i, r, lv) for i, r, lv, _ in problems(report)] == [(index, rule, level)]


def test_fault_values_say_what_is_wrong() -> None:
    def value(fault: str) -> str:
        return problems(judge(raw_hgx(hgx_derive(fault))))[0][3]

    assert value("fabric-in-progress") == ("state In Progress (status N/A): not registered with the fabric "
                                           "(is nvidia-fabricmanager running?)")
    assert value("fabric-insufficient-resources").startswith("state Completed, status Insufficient Resources")
    assert value("mig-enabled") == "Enabled, expected Disabled (gpu_mig_expected: false)"
    assert value("mig-pending") == "Disabled, Enabled pending: a GPU reset or reboot will change it"
    mig_host = judge(raw_hgx(hgx_derive("mig-enabled")), gpu_mig_expected=True)
    assert [(i, r) for i, r, _, _ in problems(mig_host)] == [(i, "mig") for i in range(1, 8)]


def test_a_gpu_held_by_another_process_is_amber_or_what_the_host_says() -> None:
    xml = gpu_fixtures.hgx_with_process(3, 51234, "/usr/bin/python3", 20480)
    report = judge(raw_hgx(xml, **{"51234": {"found": True, "ancestors": [51200, 1], "unit": "session-4.scope"}}))
    assert problems(report) == [(3, "processes", "amber", "20480 MiB held by 1 other process: pid 51234 "
                                 "/usr/bin/python3 (C, 20480 MiB); 1 of the release's server (130842 MiB)")]
    raw = raw_hgx(xml, **{"51234": {"found": False, "ancestors": [], "unit": None}})
    assert problems(judge(raw, gpu_foreign_processes="red"))[0][2:] == (
        "red", "20480 MiB held by 1 other process: pid 51234 /usr/bin/python3 (C, 20480 MiB, not in this pid "
        "namespace); 1 of the release's server (130842 MiB)")
    assert problems(judge(raw, gpu_processes_allowed=["python3"])) == []
    # under systemd the unit says it: a scheduler whose parent is no pidfile's is still the server's
    systemd = raw_hgx(**{"4303": {"found": True, "ancestors": [777, 1], "unit": "sglang@big.service"}})
    systemd["processes"]["service_pids"] = []
    assert [(i, r) for i, r, _, _ in problems(judge(systemd))] == [(i, "processes") for i in range(8) if i != 3]


def test_new_host_vars_and_their_errors() -> None:
    t = Thresholds.from_vars({"gpu_nvlink_expected": "yes", "gpu_nvlink_per_pair": "18", "gpu_mig_expected": False,
                              "gpu_processes_allowed": "dcgm*, nv-hostengine", "gpu_foreign_processes": "red"}, "h")
    assert (t.nvlink_expected, t.nvlink_per_pair, t.mig_expected, t.processes_allowed, t.foreign_processes) == (
        True, 18, False, ("dcgm*", "nv-hostengine"), "red")
    with pytest.raises(InputError, match=r"^host h: variable gpu_nvlink_expected: expected true or false, got "
                                         r"'maybe'$"):
        Thresholds.from_vars({"gpu_nvlink_expected": "maybe"}, "h")
    with pytest.raises(InputError, match=r"^host h: variable gpu_foreign_processes: expected amber or red"):
        Thresholds.from_vars({"gpu_foreign_processes": "blue"}, "h")


# --- the host side: remote/facts.py with a fake nvidia-smi and real processes -------------------

def _fake_smi(tmp_path: Path, xml: str) -> str:
    (tmp_path / "q.xml").write_text(xml)
    body = fake_nvidia_smi(str(tmp_path / "q.xml"), None).replace(
        "  *)", f"  'topo -m') cat {HGX / 'topo-m.txt'} ;;\n  *)")
    path = tmp_path / "nvidia-smi"
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


def test_host_side_topo_only_with_two_gpus_and_process_ancestry(tmp_path: Path) -> None:
    facts = runpy.run_path(str(REMOTE_FACTS))
    one = facts["nvidia_smi"](_fake_smi(tmp_path, (H200 / "nvidia-smi-q-x.xml").read_text()), True, None)
    assert "topo" not in one and one["processes"] == {"service_pids": [], "pids": {}}
    service_dir = tmp_path / "service"
    service_dir.mkdir()
    (service_dir / "sglang.pid").write_text(f"{os.getpid()}\npython3\nstarttime 1\n")  # this test is "the server"
    child = subprocess.Popen(["sleep", "30"])  # a GPU process the server started
    try:
        xml = HGX_XML.replace("<pid>4303</pid>", f"<pid>{child.pid}</pid>")
        answer = facts["nvidia_smi"](_fake_smi(tmp_path, xml), True, str(service_dir))
    finally:
        child.kill()
        child.wait()
    assert answer["topo"]["rc"] == 0 and answer["topo"]["argv"][1:] == ["topo", "-m"]
    assert answer["processes"]["service_pids"] == [os.getpid()]
    mine = answer["processes"]["pids"][str(child.pid)]
    assert mine["found"] is True and mine["ancestors"][0] == os.getpid()
    assert answer["processes"]["pids"]["4300"]["found"] is (os.path.exists("/proc/4300"))
    parsed = parse_gpu_facts(answer)
    assert parsed.topology is not None and parsed.topology.link(0, 7) == "NV18"
    assert parsed.process_owners is not None and parsed.process_owners.of_release(child.pid) == (
        f"child of {os.getpid()}")


@pytest.mark.parametrize(("name", "board"), [
    ("NVIDIA H100 80GB HBM3", True), ("NVIDIA H200", True), ("NVIDIA B200", True), ("NVIDIA H20", True),
    ("NVIDIA A100-SXM4-80GB", True), ("NVIDIA H100 PCIe", False), ("NVIDIA H100 NVL", False),
    ("NVIDIA H200 NVL", False), ("NVIDIA H800 PCIe", False), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", False),
    ("NVIDIA L40S", False),
])
def test_nvlink_expected_from_the_model_names_nvidia_smi_prints(name: str, board: bool) -> None:
    assert hgx.nvlink_expected([name] * 8, None)[0] is board
    assert hgx.nvlink_expected([name], not board) == (not board, f"gpu_nvlink_expected: {str(not board).lower()}")
