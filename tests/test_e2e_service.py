"""``fleetctl service restart --serial 1`` over a 4-host lab: one host at a time (the run journal's
times), stopping when one fails; ``deploy --serial`` with the same batches and budget."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import _NET, LabHandle, lab_usable, private_lab

from fleetctl.lab.state import default_lab_dir

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quad_lab() -> Iterator[LabHandle]:
    """A private 4-host lab (127.N.79.x) with a bare venv at /root/ml-env on every host."""
    why = lab_usable()
    if why:
        pytest.skip(why)
    with private_lab(default_lab_dir("test-lab-quad", REPO), 4, f"127.{_NET}.79.0") as lab:
        for host in lab.hosts:
            lab.ssh(host, "/usr/bin/python3 -m venv --without-pip /root/ml-env")
        yield lab


def spec(folder: Path) -> Path:
    path = folder / "bare.yml"
    path.write_text('name: bare\nversion: "1"\nbase: {adopt: /root/ml-env}\n'
                    "service: {standin: true}\nhealth: {timeout: 20, interval: 0.2}\n")
    return path


def events(journal: str) -> list[dict]:
    return [json.loads(line) for line in Path(journal).read_text().splitlines()]


def test_service_restart_serial_one_host_at_a_time_and_stops_at_a_failure(
        quad_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = quad_lab, str(quad_lab.inventory_path)
    r = run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(spec(tmp_path)), "--serial", "2", "--json")
    assert r.rc == 0, r.out + r.err
    batches = [e["hosts"] for e in events(r.json()["journal"]) if e["event"] == "batch_start"]
    assert batches == [["lab1", "lab2"], ["lab3", "lab4"]]

    r = run_cli(capsys, "-i", inv, "-l", "all", "service", "restart", "--serial", "1", "--json")
    assert r.rc == 0, r.out + r.err
    done = [e for e in events(r.json()["journal"]) if e["event"] in ("task_start", "host_done")]
    assert [(e["event"], e["host"]) for e in done] == [
        (kind, host) for host in ("lab1", "lab2", "lab3", "lab4") for kind in ("task_start", "host_done")]
    times = [e["ts"] for e in done]
    assert times == sorted(times)  # each host's restart ended before the next one's began

    # lab3's release loses its server program: its restart fails, lab4 is never touched.
    pid4 = lab.ssh("lab4", "head -1 /var/lib/fleetctl/service/sglang.pid").stdout.strip()
    lab.ssh("lab3", "rm /opt/fleetctl/current/sglang_standin.py")
    r = run_cli(capsys, "-i", inv, "-l", "all", "service", "restart", "--serial", "1", "--json")
    doc = r.json()
    assert r.rc == 2
    assert [doc["hosts"][h]["status"] for h in ("lab1", "lab2", "lab3", "lab4")] == ["ok", "ok", "failed", "failed"]
    assert doc["hosts"]["lab3"]["reason"].startswith("GET /health: the service exited")
    assert doc["halted"] == "every host of the batch failed (1): stopped after batch 3 of 4"
    assert doc["hosts"]["lab4"]["reason"] == f"not started: {doc['halted']}"
    assert lab.ssh("lab4", "head -1 /var/lib/fleetctl/service/sglang.pid").stdout.strip() == pid4
    kinds = [(e["event"], e.get("host")) for e in events(doc["journal"])]
    assert ("halted", None) in kinds and ("task_start", "lab4") not in kinds

    # A budget lets the rollout go on past one failed host.
    r = run_cli(capsys, "-i", inv, "-l", "all", "service", "restart", "--serial", "1", "--max-failures", "1", "--json")
    assert r.rc == 2 and r.json()["halted"] is None
    assert r.json()["hosts"]["lab4"]["status"] == "ok"
    status = run_cli(capsys, "-i", inv, "-l", "lab4", "service", "status", "--json").json()
    assert status["hosts"]["lab4"]["value"]["servers"][0]["running"] is True
