"""Several servers of one release on one host (instances), on the lab fleet: both healthy with their
own GPUs and ports, both in status and logs; one failing its gate takes the whole host back;
rollback restarts both; and the supervisor brings a server back after its host restarts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle, process_gone

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
PLAIN = Path(__file__).resolve().parents[1] / "playbooks" / "releases" / "sglang-0.5.23-lab.yml"


def two_instances(folder: Path, name: str = "pair", sick_b: bool = False) -> Path:
    """tp4-a on GPUs 0-3 and tp4-b on 4-7 of one host, each on its own port; ``sick_b``: tp4-b's
    /health answers 503, so its own (short) gate fails."""
    b_args = '[--tp, "4", --standin-health-status, "503"]' if sick_b else '[--tp, "4"]'
    spec = folder / f"{name}.yml"
    spec.write_text(
        f'name: {name}\nversion: "1"\nbase: {{adopt: /root/ml-env}}\nrequires: {{sglang: "==0.5.23"}}\n'
        "service:\n  standin: true\n  args: [--speculative-algorithm, DFLASH, --tp, \"8\"]\n"
        "  instances:\n"
        '    - {name: tp4-a, gpus: "0,1,2,3", port: 30001, args: [--tp, "4"]}\n'
        f'    - {{name: tp4-b, gpus: "4,5,6,7", port: "{{{{ 30001 + 1 }}}}", args: {b_args},\n'
        "       health: {timeout: 3, interval: 0.2}}\n"
        "health: {timeout: 60, interval: 0.2}\n")
    return spec


def cli(capsys: pytest.CaptureFixture[str], lab: LabHandle, *args: str):  # type: ignore[no-untyped-def]
    return run_cli(capsys, "-i", str(lab.inventory_path), *args)


def server_info(lab: LabHandle, host: str, port: int) -> dict:
    out = lab.ssh(host, f"/usr/bin/python3 -c \"import urllib.request as u; print(u.urlopen("
                        f"'http://{lab.addresses[host]}:{port}/server_info', timeout=5).read().decode())\"")
    return json.loads(out.stdout)


def test_two_instances_deploy_gate_rollback_and_logs(release_free_lab: LabHandle, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    lab, on = release_free_lab, ("-l", "lab1")
    plain, pair = load_spec(PLAIN).release_id, two_instances(tmp_path)
    assert cli(capsys, lab, *on, "deploy", str(PLAIN)).rc == 0

    plan = cli(capsys, lab, *on, "deploy", str(pair), "--check", "--diff", "--json")
    diffs = plan.json()["hosts"]["lab1"]["value"]["diffs"]
    assert diffs["service.tp4-a.command"].endswith("--port 30001 -- --speculative-algorithm DFLASH --tp 4\n")
    assert "--port 30002 " in diffs["service.tp4-b.command"]
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7\n" in diffs["service.tp4-b.env"]

    r = cli(capsys, lab, *on, "deploy", str(pair), "--json")
    assert r.rc == 0, r.out + r.err
    gates = r.json()["hosts"]["lab1"]["value"]["gates"]
    assert [(g["name"], g["ok"]) for g in gates] == [("tp4-a: GET /health", True), ("tp4-b: GET /health", True)]
    for port, gpus in ((30001, "0,1,2,3"), (30002, "4,5,6,7")):
        info = server_info(lab, "lab1", port)
        assert (info["port"], info["tp_size"], info["fleetctl_standin"]["cuda_visible_devices"]) == (port, 4, gpus)
    status = cli(capsys, lab, *on, "status", "--json").json()["hosts"]["lab1"]["value"]
    assert [(s["name"], s["running"], s["health"], s["port"]) for s in status["instances"]] == [
        ("tp4-a", True, "200", 30001), ("tp4-b", True, "200", 30002)]
    # The plain release's single server was stopped when the host switched to the pair.
    # The lab shares this machine's pid space; an orphan reaped late is a zombie, which is gone too.
    old_pid = lab.ssh("lab1", "head -1 /var/lib/fleetctl/service/sglang.pid").stdout.strip()
    assert old_pid.isdigit() and process_gone(int(old_pid)), old_pid
    table = cli(capsys, lab, *on, "status")
    assert "tp4-a" in table.out and "tp4-b" in table.out

    logs = cli(capsys, lab, *on, "logs", "-n", "3")
    assert logs.rc == 0 and "==> tp4-a (" in logs.out and "==> tp4-b (" in logs.out
    only_b = cli(capsys, lab, *on, "logs", "tp4-b", "--json").json()["hosts"]["lab1"]["value"]
    assert only_b["source"].endswith("/service/sglang@tp4-b.log") and any("--port 30002" in x for x in only_b["lines"])
    bad = cli(capsys, lab, *on, "logs", "tp4-c")
    assert bad.rc == 2 and "no instance tp4-c in the current release (has: tp4-a, tp4-b)" in bad.out
    since = cli(capsys, lab, *on, "logs", "--since", "1 hour ago", "--json")  # never silently every line
    assert since.rc == 2 and since.json()["hosts"]["lab1"]["reason"] == (
        "--since needs the journal (systemd); this server logs to /var/lib/fleetctl/service/sglang@tp4-a.log "
        "under fleetctl's supervisor: use -n instead"), since.out

    # tp4-b of the next release fails its own gate: the whole host goes back, both instances serving.
    sick = two_instances(tmp_path, "pair-sick", sick_b=True)
    r = cli(capsys, lab, *on, "deploy", str(sick), "--json")
    lab1 = r.json()["hosts"]["lab1"]
    assert r.rc == 2 and lab1["value"]["outcome"] == "rolled-back"
    assert lab1["reason"].startswith("health gate failed: tp4-b: GET /health: not healthy within 3s")
    assert [(g["name"], g["ok"]) for g in lab1["value"]["rollback_gates"]] == [
        ("tp4-a: GET /health", True), ("tp4-b: GET /health", True)]
    assert {server_info(lab, "lab1", p)["fleetctl_standin"]["release"] for p in (30001, 30002)} == {
        load_spec(pair).release_id}

    # Rollback to the plain release stops both instances; rolling forward again restarts both.
    back = cli(capsys, lab, *on, "rollback", "--to", plain, "--json")
    assert back.rc == 0 and back.json()["hosts"]["lab1"]["value"]["to"] == plain
    assert server_info(lab, "lab1", 30000)["fleetctl_standin"]["release"] == plain
    status = cli(capsys, lab, *on, "status", "--json").json()["hosts"]["lab1"]["value"]
    assert [(s["name"], s["running"]) for s in status["instances"]] == [("sglang", True)]
    again = cli(capsys, lab, *on, "rollback", "--to", load_spec(pair).release_id, "--json")
    assert again.rc == 0, again.out + again.err
    assert [g["name"] for g in again.json()["hosts"]["lab1"]["value"]["gates"]] == [
        "tp4-a: GET /health", "tp4-b: GET /health"]


def wait_serving(capsys: pytest.CaptureFixture[str], lab: LabHandle, host: str, seconds: float = 120) -> dict:
    """``status --json`` of ``host`` once its server answers /health 200 (or the last one after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while True:
        r = cli(capsys, lab, "-l", host, "status", "--json")
        value = (r.json()["hosts"][host].get("value") or {}) if r.out.strip() else {}
        if value.get("health") == "200" or time.monotonic() > deadline:
            return value
        time.sleep(1)


def test_supervisor_restarts_a_crashed_server_and_a_rebooted_host_serves_again(
        release_free_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    lab = release_free_lab
    assert cli(capsys, lab, "-l", "lab3", "deploy", str(PLAIN)).rc == 0
    before = lab.ssh("lab3", "head -1 /var/lib/fleetctl/service/sglang.pid").stdout.strip()
    lab.ssh("lab3", f"kill -9 {before}")
    deadline = time.monotonic() + 60
    status: dict = {}
    while time.monotonic() < deadline and not status.get("service", {}).get("restarts"):
        status = cli(capsys, lab, "-l", "lab3", "status", "--json").json()["hosts"]["lab3"]["value"]
        time.sleep(0.5)
    assert status["service"]["restarts"] == 1 and status["service"]["last_exit"] == "exited with signal 9"
    status = wait_serving(capsys, lab, "lab3")
    assert status["service"]["pid"] != int(before)
    assert "supervisor: server exited with signal 9; restart 1 in 1s" in lab.ssh(
        "lab3", "cat /var/lib/fleetctl/service/sglang.log").stdout

    with lab.stop("lab3"):  # a reboot: every process of the host ends, sshd and the server with it
        pass  # the restorer starts the host again, whose boot runs /etc/fleetctl/boot.d
    status = wait_serving(capsys, lab, "lab3")
    assert status["health"] == "200" and status["service"]["supervised"] is True
    assert status["service"]["enabled"] is True and status["current"] == load_spec(PLAIN).release_id
