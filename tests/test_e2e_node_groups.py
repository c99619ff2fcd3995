"""A multi-node server rolled out by a playbook's ``release`` task, on the lab fleet: the task renders
``nnodes``, ``node_rank`` and ``dist_init_addr`` from the inventory exactly as ``fleetctl deploy``
does (one function, ``release/nodegroups.annotate``), and the play's ``serial_group_var`` keeps
the group's nodes in one batch even where inventory order and ``serial: 1`` would split them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import run_cli
from lab_support import LabHandle, user_inventory
from service_cleanup import clean_releases

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
HOSTS = ("lab1", "lab2", "lab3")
CLEAN = clean_releases("/opt/fleetctl", "/root/mn-env")


@pytest.fixture
def clean_lab(lab_fleet: LabHandle) -> Iterator[LabHandle]:
    for host in HOSTS:
        lab_fleet.ssh(host, f"{CLEAN}; /usr/bin/python3 -m venv --without-pip /root/mn-env")
    yield lab_fleet
    for host in HOSTS:
        lab_fleet.ssh(host, CLEAN)


def test_a_playbook_release_renders_node_vars_and_keeps_the_group_in_one_batch(
        clean_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = clean_lab
    # lab1 and lab3 are one two-node server; lab2 a server of its own.
    inv = user_inventory(lab, tmp_path / "inv.yml", "root", {"lab1": {"mn": "big"}, "lab2": {"mn": "small"},
                                                              "lab3": {"mn": "big"}})
    spec = tmp_path / "multi.yml"
    spec.write_text('name: multi\nversion: "1"\nbase: {adopt: /root/mn-env}\nservice:\n  standin: true\n'
                    "  node_group: mn\n"
                    '  args: [--nnodes, "{{ nnodes }}", --node-rank, "{{ node_rank }}", '
                    '--dist-init-addr, "{{ dist_init_addr }}"]\n'
                    "health: {timeout: 30, interval: 0.2}\n")
    book = tmp_path / "roll.yml"
    book.write_text(yaml.safe_dump([{"name": "roll", "hosts": "lab", "serial": 1, "serial_group_var": "mn",
                                     "tasks": [{"name": "deploy", "release": str(spec)}]}], sort_keys=False))
    r = run_cli(capsys, "-i", str(inv), "run", str(book), "--json")
    assert r.rc == 0, r.out + r.err
    journal = inv.parent / ".fleetctl" / "runs" / f"{r.json()['run_id']}.jsonl"
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [e["hosts"] for e in events if e["event"] == "batch_start"] == [["lab1", "lab3"], ["lab2"]]

    status = run_cli(capsys, "-i", str(inv), "status", "--json").json()["hosts"]
    argv = {h: status[h]["value"]["argv"] for h in HOSTS}
    first = f"{lab.addresses['lab1']}:20000"

    def node(h: str) -> list[str]:
        a = argv[h]
        return [a[a.index(flag) + 1] for flag in ("--nnodes", "--node-rank", "--dist-init-addr")]

    assert node("lab1") == ["2", "0", first] and node("lab3") == ["2", "1", first]
    assert node("lab2") == ["1", "0", f"{lab.addresses['lab2']}:20000"]
    assert {status[h]["value"]["current"] for h in HOSTS} == {load_spec(spec).release_id}


def group_spec(folder: Path, version: str, health: str, extra: str = "") -> Path:
    spec = folder / f"group-{version}.yml"
    spec.write_text(f'name: group\nversion: "{version}"\nbase: {{adopt: /root/mn-env}}\nservice:\n  standin: true\n'
                    "  node_group: mn\n"
                    '  args: [--nnodes, "{{ nnodes }}", --node-rank, "{{ node_rank }}", '
                    f'--dist-init-addr, "{{{{ dist_init_addr }}}}"{extra}]\n'
                    f"health: {health}\n")
    return spec


def test_a_multi_node_server_is_gated_for_what_each_rank_serves_and_goes_back_as_one(
        clean_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """lab1 (rank 0) and lab3 (rank 1) are one server. A rank > 0 serves only SGLang's health server
    (no /generate, no /server_info): the warm-up and thresholds are rank 0's, rank 1 is gated on its
    /health. When rank 1 fails its gate, rank 0 (which passed) goes back with it: the whole group
    runs the release it ran before, and the run says why."""
    lab = clean_lab
    inv = user_inventory(lab, tmp_path / "inv.yml", "root", {"lab1": {"mn": "big"}, "lab3": {"mn": "big"}})

    def deploy(spec: Path) -> dict[str, Any]:
        r = run_cli(capsys, "-i", str(inv), "-l", "lab1,lab3", "deploy", "-y", str(spec), "--json")
        assert r.rc in (0, 2), r.out + r.err
        return {h: v for h, v in r.json()["hosts"].items()}

    plain = group_spec(tmp_path, "1", "{timeout: 30, interval: 0.2}")
    assert all(v["status"] == "ok" for v in deploy(plain).values())
    gated = group_spec(tmp_path, "2", "{timeout: 30, interval: 0.2, warmup: {requests: 1, max_tokens: 4}, "
                                      "thresholds: [{field: max_total_num_tokens, min: 1}]}")
    hosts = deploy(gated)
    assert {h: v["status"] for h, v in hosts.items()} == {"lab1": "ok", "lab3": "ok"}, hosts
    assert [g["name"] for g in hosts["lab1"]["value"]["gates"]] == [
        "GET /health", "warm-up", "/server_info max_total_num_tokens >= 1"]
    assert [g["name"] for g in hosts["lab3"]["value"]["gates"]] == ["GET /health"]
    assert_current(lab, load_spec(gated).release_id)

    # rank 1's server never turns healthy (its /health stays 503); rank 0's does
    sick = group_spec(tmp_path, "3", "{timeout: 5, interval: 0.2}",
                      ', --standin-health-status, "{{ 503 if node_rank == 1 else 200 }}"')
    hosts = deploy(sick)
    assert hosts["lab3"]["value"]["outcome"] == "rolled-back"
    assert hosts["lab1"]["status"] == "failed" and hosts["lab1"]["value"]["outcome"] == "rolled-back"
    reason = hosts["lab1"]["reason"]
    assert reason.startswith("health gate failed: node group: mn=big: rank 1 (lab3) failed: GET /health: "), reason
    assert f"; this node went back with its group to {load_spec(gated).release_id}" in reason
    assert_current(lab, load_spec(gated).release_id)


def assert_current(lab: LabHandle, release_id: str) -> None:
    for host in ("lab1", "lab3"):
        assert lab.ssh(host, "basename $(readlink /opt/fleetctl/current)").stdout.strip() == release_id, host


def test_a_play_rolling_back_failed_hosts_takes_the_whole_group(
        clean_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """on_failure: rollback_failed with serial_group_var: rank 1 fails, and rank 0, which passed,
    goes back with it; lab2, a server of its own in the same batch, stays on the new release."""
    lab = clean_lab
    inv = user_inventory(lab, tmp_path / "inv.yml", "root", {"lab1": {"mn": "big"}, "lab2": {"mn": "small"},
                                                              "lab3": {"mn": "big"}})
    plain = group_spec(tmp_path, "1", "{timeout: 30, interval: 0.2}")
    first = run_cli(capsys, "-i", str(inv), "-l", "lab", "deploy", "-y", str(plain))
    assert first.rc == 0, first.out + first.err
    sick = group_spec(tmp_path, "3", "{timeout: 5, interval: 0.2}",
                      ', --standin-health-status, "{{ 503 if node_rank == 1 else 200 }}"')
    book = tmp_path / "roll.yml"
    book.write_text(yaml.safe_dump([{"name": "roll", "hosts": "lab", "serial_group_var": "mn",
                                     "on_failure": "rollback_failed", "max_fail_percentage": 0,
                                     "tasks": [{"name": "deploy", "release": str(sick)}]}], sort_keys=False))
    r = run_cli(capsys, "-i", str(inv), "run", str(book), "--json")
    assert r.rc == 2, r.out + r.err
    assert_current(lab, load_spec(plain).release_id)  # lab1 and lab3: the group, back as one
    assert lab.ssh("lab2", "basename $(readlink /opt/fleetctl/current)").stdout.strip() == load_spec(sick).release_id


def group_on_two_releases(lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str, str]:
    """lab1 (rank 0) and lab3 (rank 1) one server, deployed with release 1 then 2: (inventory, id 1, id 2)."""
    inv = user_inventory(lab, tmp_path / "inv.yml", "root", {"lab1": {"mn": "big"}, "lab3": {"mn": "big"}})
    ids = []
    for version in ("1", "2"):
        spec = group_spec(tmp_path, version, "{timeout: 30, interval: 0.2}")
        r = run_cli(capsys, "-i", str(inv), "-l", "lab1,lab3", "deploy", "-y", str(spec))
        assert r.rc == 0, r.out + r.err
        ids.append(load_spec(spec).release_id)
    return inv, ids[0], ids[1]


def test_a_rollback_whose_rank_fails_leaves_the_group_on_one_release(
        clean_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """rollback --serial 1 takes the group in one batch (the node group its release was deployed
    with, no --group-by needed); rank 1's release 1 no longer starts, so its rollback fails: rank 0,
    which went back to 1, returns to 2 with it, and says which rank failed. Never 1 and 2 at once."""
    lab = clean_lab
    inv, first, second = group_on_two_releases(lab, tmp_path, capsys)
    lab.ssh("lab3", f"rm /opt/fleetctl/releases/{first}/sglang_standin.py")
    r = run_cli(capsys, "-i", str(inv), "-l", "lab1,lab3", "rollback", "-y", "--serial", "1", "--timeout", "8",
                "--json")
    assert r.rc == 2, r.out + r.err
    hosts = r.json()["hosts"]
    assert hosts["lab1"]["status"] == "failed", hosts
    reason = hosts["lab1"]["reason"]  # rank 0's own /health fails too: a rank is missing
    assert "node group: mn=big: " in reason and "rank 1 (lab3) failed: GET /health: the service exited" in reason
    assert f"this node went back with its group to {second}" in hosts["lab1"]["reason"]
    assert_current(lab, second)
    journal = [json.loads(line) for line in Path(r.json()["journal"]).read_text().splitlines()]
    assert [e["hosts"] for e in journal if e["event"] == "batch_start"] == [["lab1", "lab3"]]


def test_a_service_restart_whose_rank_fails_fails_the_whole_group(
        clean_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """service restart --serial 1: the group's nodes restart together in one batch; rank 1 does not
    come back, so rank 0 (restarted, healthy on its own /health) fails with it, naming rank 1."""
    lab = clean_lab
    inv, _first, second = group_on_two_releases(lab, tmp_path, capsys)
    lab.ssh("lab3", f"rm /opt/fleetctl/releases/{second}/sglang_standin.py")
    r = run_cli(capsys, "-i", str(inv), "-l", "lab1,lab3", "service", "restart", "-y", "--serial", "1",
                "--timeout", "8", "--json")
    assert r.rc == 2, r.out + r.err
    hosts = r.json()["hosts"]
    assert hosts["lab3"]["status"] == "failed", hosts
    assert hosts["lab1"]["status"] == "failed", hosts
    reason = hosts["lab1"]["reason"]  # the group's line first: it names the rank that did not come back
    assert reason.startswith("node group: mn=big: ") and "rank 1 (lab3) failed: GET /health: the service exited" \
        in reason, reason
    journal = [json.loads(line) for line in Path(r.json()["journal"]).read_text().splitlines()]
    assert [e["hosts"] for e in journal if e["event"] == "batch_start"] == [["lab1", "lab3"]]
