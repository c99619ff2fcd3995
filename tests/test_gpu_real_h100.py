"""The REAL single-H100 capture of 2026-12-05 (tests/fixtures/nvidia-smi/h100-1x-processes/, see its
README row): two processes held GPU 0 while fleetctl ran on the device machine, one under the release's
pidfile and one foreign. The host's own answer (``raw-facts.json``, remote/facts.py's ``main`` there)
judged here on the controller must give what ``fleetctl gpu health --json`` printed on that machine,
check for check; the processes, persistence, MIG, fabric and topology rules on real output."""

from __future__ import annotations

import json
from typing import Any

from gpu_fixtures import SMI, raw_smi

from fleetctl.gpu.health import HostHealth, Level, Thresholds, evaluate
from fleetctl.gpu.smi import parse_gpu_facts

H100 = SMI / "h100-1x-processes"
RUN = H100 / "fleetctl-run"
VARS: dict[str, Any] = {"gpus_expected": 1, "gpu_model": "H200|H100"}  # the device run's inventory
HELD = ("1542 MiB held by 1 other process: pid 541 python3 (C, 1542 MiB); 1 of the release's server (1542 MiB)")


def host_answer() -> dict[str, Any]:
    return dict(json.loads((RUN / "raw-facts.json").read_text())["nvidia_smi"])


def judge(raw: dict[str, Any], **host_vars: Any) -> HostHealth:
    return evaluate(parse_gpu_facts(raw), Thresholds.from_vars({**VARS, **host_vars}, "hgx-dev"), "hgx-dev")


def checks(report: HostHealth) -> dict[str, tuple[str, str]]:
    return {c.rule: (c.level.value, c.value) for g in report.gpus for c in g.checks}


def test_the_host_found_the_servers_child_by_its_pidfile_and_the_other_as_foreign() -> None:
    processes = host_answer()["processes"]
    holders = (H100 / "holders.txt").read_text()
    assert "server (pidfile) pid 540, its child (GPU 0) 544, foreign pid 541" in holders
    assert processes["service_pids"] == [540]
    assert 540 in processes["pids"]["544"]["ancestors"] and 540 not in processes["pids"]["541"]["ancestors"]
    listed = (H100 / "holding-compute-apps.csv").read_text().splitlines()[1:]
    assert sorted(line.split(",")[0] for line in listed) == ["541", "544"]  # nvidia-smi's own view


def test_controller_verdicts_equal_what_fleetctl_printed_on_the_device() -> None:
    printed = json.loads((RUN / "gpu-health.json").read_text())["hosts"]["hgx-dev"]["value"]
    here = judge(host_answer()).to_dict()
    said = {c["rule"]: c["level"] for g in printed["gpus"] for c in g["checks"]}
    assert {c["rule"]: c["level"] for g in here["gpus"] for c in g["checks"]} == said
    assert here["level"] == printed["level"] == "amber" and here["summary"] == printed["summary"]


def test_processes_persistence_mig_fabric_topology_on_the_real_h100() -> None:
    report = judge(host_answer())
    got = checks(report)
    assert got["processes"] == ("amber", HELD)
    assert got["persistence"] == ("green", "Enabled") and got["mig"] == ("green", "Disabled")
    assert got["fabric"] == ("green", "n/a (no NVLink fabric on this GPU)")
    assert got["topology"] == ("green", "1 GPU: no pair to connect") and got["nvlink"] == ("green", "no NVLink")
    assert [r for r, (level, _) in got.items() if level != "green"] == ["processes"]
    assert checks(judge(host_answer(), gpu_foreign_processes="red"))["processes"] == ("red", HELD)
    allowed = judge(host_answer(), gpu_processes_allowed=["python3"])
    assert all(c.level is Level.GREEN for g in allowed.gpus for c in g.checks)
    printed = (RUN / "gpu-health-allowed.txt").read_text()
    assert "hgx-dev: green: 1 GPU, every check green" in printed and printed.rstrip().endswith("rc=0")


def test_the_capture_before_the_holders_started_has_no_process_and_is_green() -> None:
    xml = (H100 / "nvidia-smi-q-x.xml").read_text()
    assert "<processes>\n\t\t</processes>" in xml
    report = judge(raw_smi(xml))
    assert report.level is Level.GREEN, report.summary()
    assert checks(report)["processes"][0] == "green"
