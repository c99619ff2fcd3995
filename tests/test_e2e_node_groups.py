"""A multi-node server rolled out by a playbook's ``release`` task, on the lab fleet: the task renders
``nnodes``, ``node_rank`` and ``dist_init_addr`` from the inventory exactly as ``fleetctl deploy``
does (one function, ``release/nodegroups.annotate``), and the play's ``serial_group_var`` keeps
the group's nodes in one batch even where inventory order and ``serial: 1`` would split them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

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
