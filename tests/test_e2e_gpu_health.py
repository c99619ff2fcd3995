"""``fleetctl gpu health`` end to end on the lab fleet (real sshd hosts), each host with a fake
nvidia-smi (host var ``nvidia_smi``, given here with ``-e``) that prints the real H200 capture or a
fault derived from it: exit codes, ``--json`` fields, an unreachable host. The rollout that leaves
a red host out is in test_e2e_playbook.py (it needs that module's release lab)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cli_support import CliRun, run_cli
from gpu_fixtures import FAKE_SMI, lab2_remapping_pending
from lab_support import LabHandle

pytestmark = pytest.mark.lab
VARS = ("-e", f"nvidia_smi={FAKE_SMI}", "-e", "gpus_expected=1", "-e", "gpu_model=H200")


@pytest.fixture(scope="module")
def gpu_lab(lab_fleet: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabHandle]:
    """lab1 and lab3 print the real capture; lab2 the capture with row remapping pending."""
    with lab2_remapping_pending(lab_fleet, tmp_path_factory.mktemp("fake-smi")):
        yield lab_fleet


def health(capsys: pytest.CaptureFixture[str], lab: LabHandle, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(lab.inventory_path), *VARS, "gpu", "health", *args)


def test_exit_codes_over_ssh(gpu_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = health(capsys, gpu_lab)
    assert r.rc == 1, r.out + r.err
    assert "lab2: RED: GPU 0 row_remapping (pending: yes, failure: no" in r.out
    assert "lab1: green: 1 GPU, every check green" in r.out and "lab3: green" in r.out
    assert health(capsys, gpu_lab, "-l", "lab1,lab3").rc == 0
    with gpu_lab.stop("lab3"):
        down = health(capsys, gpu_lab, "-l", "lab1,lab3")
        assert down.rc == 2, down.out + down.err
        assert "lab3: unreachable" in down.err and "lab1: green" in down.out
    wrong = run_cli(capsys, "-i", str(gpu_lab.inventory_path), *VARS, "-e", "gpus_expected=8", "gpu", "health",
                    "-l", "lab1")
    assert wrong.rc == 1 and "lab1: RED: host gpu_count (1 GPU(s), expected 8)" in wrong.out


def test_json_fields_over_ssh(gpu_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = health(capsys, gpu_lab, "--json")
    doc = r.json()
    assert r.rc == 1 and doc["red_hosts"] == ["lab2"] and doc["amber_hosts"] == []
    assert doc["summary"] == {"ok": 3, "failed": 0, "unreachable": 0}
    lab2 = doc["hosts"]["lab2"]["value"]
    assert (lab2["host"], lab2["level"]) == ("lab2", "red")
    [host, gpu] = lab2["gpus"]
    assert [c["rule"] for c in host["checks"]] == ["gpu_count", "gpu_model", "topology"]
    assert (gpu["index"], gpu["name"], gpu["pci_bus_id"], gpu["level"]) == (0, "NVIDIA H200", "00000000:00:06.0",
                                                                            "red")
    assert [(c["rule"], c["level"]) for c in gpu["checks"] if c["level"] != "green"] == [("row_remapping", "red")]
    processes = next(c for c in gpu["checks"] if c["rule"] == "processes")  # the host's answer over SSH
    assert (processes["level"], processes["value"]) == ("green", "no process")
    xid = next(c for c in gpu["checks"] if c["rule"] == "xid")
    assert xid["level"] in ("green", "amber")  # the lab hosts share this machine's kernel log
    facts = run_cli(capsys, "-i", str(gpu_lab.inventory_path), *VARS, "-l", "lab2", "facts", "--json").json()
    assert facts["hosts"]["lab2"]["value"]["gpu_health"]["level"] == "red"
