"""``fleetctl gpu health`` and ``facts --json`` in-process over local connections, each host with its own
fake nvidia-smi (host var ``nvidia_smi``) printing the real H200 capture or a fault derived from it;
and the ``gpu_health`` playbook module failing a red host before the tasks after it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cli_support import CliRun, run_cli
from gpu_fixtures import derive, fake_nvidia_smi


def _host(tmp_path: Path, name: str, xml: str | None, **host_vars: object) -> dict[str, object]:
    folder = tmp_path / name
    folder.mkdir()
    entry: dict[str, object] = {"ansible_connection": "local", "gpus_expected": 1, "gpu_model": "H200", **host_vars}
    if xml is not None:
        (folder / "q.xml").write_text(xml)
        (folder / "nvlink.txt").write_text("")
        smi = folder / "nvidia-smi"
        smi.write_text(fake_nvidia_smi(str(folder / "q.xml"), str(folder / "nvlink.txt")))
        smi.chmod(0o755)
        entry["nvidia_smi"] = str(smi)
    return entry


def inventory(tmp_path: Path, hosts: dict[str, dict[str, object]]) -> Path:
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"gpu": {"hosts": hosts}}}}))
    return path


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    from gpu_fixtures import H200_XML

    return inventory(tmp_path, {"good": _host(tmp_path, "good", H200_XML),
                                "remap": _host(tmp_path, "remap", derive("remap-pending")),
                                "capped": _host(tmp_path, "capped", derive("sw-power-cap"))})


def gpu_health(capsys: pytest.CaptureFixture[str], inv: Path, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(inv), "gpu", "health", *args)


def test_exit_codes_green_amber_red(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_health(capsys, fleet, "-l", "good").rc == 0
    assert gpu_health(capsys, fleet, "-l", "good,capped").rc == 0  # amber is not a failure
    r = gpu_health(capsys, fleet)
    assert r.rc == 1, r.out + r.err
    assert "remap: RED: GPU 0 row_remapping (pending: yes, failure: no" in r.out
    assert "capped: AMBER: GPU 0 power_cap (SW power cap active" in r.out
    assert "good: green: 1 GPU, every check green" in r.out
    assert "3 hosts: 3 ok, 0 failed, 0 unreachable" in r.out


def test_problems_only_and_json_fields(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = gpu_health(capsys, fleet, "--problems").out
    assert "row_remapping" in text and "ecc_uncorrectable" not in text
    r = gpu_health(capsys, fleet, "--json")
    doc = r.json()
    assert r.rc == 1 and doc["red_hosts"] == ["remap"] and doc["amber_hosts"] == ["capped"]
    assert doc["summary"] == {"ok": 3, "failed": 0, "unreachable": 0}
    remap = doc["hosts"]["remap"]["value"]
    assert (remap["host"], remap["level"]) == ("remap", "red")
    gpu = remap["gpus"][1]
    assert (gpu["index"], gpu["name"], gpu["uuid"], gpu["level"]) == (
        0, "NVIDIA H200", "GPU-28ae6ea3-f249-f5c0-a899-11761687074b", "red")
    checks = {c["rule"]: c for c in gpu["checks"]}
    assert checks["row_remapping"]["level"] == "red" and checks["row_remapping"]["value"].startswith("pending: yes")
    assert {c["level"] for rule, c in checks.items() if rule != "row_remapping"} == {"green"}
    assert remap["gpus"][0]["checks"][0] == {"rule": "gpu_count", "level": "green", "value": "1 GPU(s), expected 1"}
    assert remap["thresholds"]["gpu_model"] == "H200"


def test_facts_json_carries_the_same_health(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(fleet), "-l", "remap", "facts", "--json")
    assert r.rc == 0
    value = r.json()["hosts"]["remap"]["value"]
    assert value["gpu_health"]["summary"].startswith("red: GPU 0 row_remapping (pending: yes")
    assert value["gpus"]["gpus"][0]["readings"]["remap_pending"] is True
    assert value["gpus"]["gpus"][0]["vbios_version"] == "96.00.A5.00.1A"


def test_a_failed_host_is_exit_2_and_a_bad_threshold_exit_3(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_fixtures import H200_XML

    inv = inventory(tmp_path, {"good": _host(tmp_path, "good", H200_XML),
                               "closed": {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_timeout": 5}})
    r = gpu_health(capsys, inv)
    assert r.rc == 2, r.out + r.err  # the good host's checks are still printed
    assert "closed: unreachable" in r.err and "good: green" in r.out
    assert "2 hosts: 1 ok, 0 failed, 1 unreachable" in r.out
    bad = inventory(tmp_path, {"good": _host(tmp_path, "good2", H200_XML, gpu_pcie_width_min="wide")})
    r = gpu_health(capsys, bad)
    assert (r.rc, r.out) == (3, "")
    assert r.err == "fleetctl: error: host good: variable gpu_pcie_width_min: expected a whole number, got 'wide'\n"
    facts = run_cli(capsys, "-i", str(bad), "facts")
    assert (facts.rc, facts.err) == (3, r.err)


def test_gpu_health_module_fails_a_red_host_before_the_next_task(fleet: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "deployed-{{ inventory_hostname }}"
    book = tmp_path / "book.yml"
    book.write_text(yaml.safe_dump([{"hosts": "gpu", "tasks": [
        {"name": "GPU health", "gpu_health": None},
        {"name": "stand-in for the release", "shell": f"touch {marker}"}]}]))
    r = run_cli(capsys, "-i", str(fleet), "run", str(book), "--json")
    assert r.rc == 2, r.out + r.err
    doc = r.json()
    assert doc["recap"]["remap"]["failed"] == 1 and doc["recap"]["good"]["failed"] == 0
    assert sorted(p.name for p in tmp_path.glob("deployed-*")) == ["deployed-capped", "deployed-good"]
    first = doc["results"]["remap"][0]
    assert first["status"] == "failed" and first["msg"].startswith("GPU health red: GPU 0 row_remapping")
    assert first["data"]["level"] == "red"
    check = run_cli(capsys, "-i", str(fleet), "run", str(book), "--check", "--json")
    assert check.json()["results"]["remap"][0]["status"] == "failed"  # read-only: runs in check mode too
