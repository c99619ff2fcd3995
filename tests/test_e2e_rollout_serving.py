# ruff: noqa: F811  (the lab fixtures imported from test_e2e_playbook are test arguments here)
"""Rollouts of a fleet that serves traffic, end to end on the 4-host rollout lab of
test_e2e_playbook.py (real sshd hosts, the real sglang 0.5.23 wheel, the stand-in server):
a staging failure stops the run before any switch; a playbook drains each host at a stand-in load
balancer on the controller (delegate_to: localhost + uri), deploys, and undrains in `always`, on
success and when batch 2 fails (rescue, always, rollback_all); a server killed during the soak
fails its batch; min_healthy with one host already down stops the rollout before the next batch;
progress_deadline ends a rollout whose task hangs, naming the batch and the task; `deploy --stage`
builds without switching and the next deploy reuses that build."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_support import LabHandle
from lb_support import load_balancer
from test_e2e_playbook import (  # noqa: F401  (lab, rollout_lab: the fixtures)
    DDTREE,
    HOSTS,
    REPO,
    current,
    currents,
    ddtree_id,
    journal_events,
    lab,
    plain_id,
    playbook,
    rollout,
    rollout_lab,
    run,
    serving,
    wait_for_event,
)

pytestmark = pytest.mark.lab
KILL_SERVICE = "f=/var/lib/fleetctl/service/sglang.pid; kill -9 $(head -1 $f)"
# Down for good: the supervisor first (it would start the server again), then the server.
STOP_SERVICE = "kill -9 $(head -1 /var/lib/fleetctl/service/sglang.supervisor.pid); " + KILL_SERVICE


def test_a_staging_failure_stops_the_run_before_any_switch(lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    folder = f"/opt/fleetctl/releases/{ddtree_id()}"
    # lab3 holds another build under the release's id: its staging is refused there
    lab.ssh("lab3", f"rm -rf {folder} && mkdir -p {folder} && echo '{{\"spec_digest\": \"other\"}}' > {folder}/"
                    "manifest.json")
    try:
        r = run(capsys, lab, str(REPO / "playbooks" / "deploy-ddtree.yml"), "-e", "target=lab",
                "-e", f"release_spec={DDTREE}", "--json")
        doc = r.json()
    finally:
        lab.ssh("lab3", f"rm -rf {folder}")
    assert r.rc == 2 and doc["status"] == "halted", r.out + r.err
    events = journal_events(lab, doc["run_id"])
    assert [e["why"] for e in events if e["event"] == "halted"][0].startswith("max_fail_percentage 0% exceeded")
    assert not [e for e in events if e["event"] == "play_start" and e["play"] == 1]  # the rollout never began
    assert currents(lab) == dict.fromkeys(HOSTS, plain_id())
    assert {serving(lab, h) for h in HOSTS} == {plain_id()}


def drained_rollout(url: str, **play: object) -> list[dict[str, object]]:
    def at_lb(action: str) -> dict[str, str]:
        return {"method": "POST", "url": f"{url}/{action}/{{{{ inventory_hostname }}}}"}

    return [{"name": "drained rollout", "hosts": "lab", **play,
             "before_rollback": [{"name": "drain for the rollback", "uri": at_lb("drain"),
                                  "delegate_to": "localhost"}],
             "after_rollback": [{"name": "undrain after the rollback", "uri": at_lb("undrain"),
                                 "delegate_to": "localhost"}],
             "tasks": [{
        "block": [
            {"name": "drain", "uri": {"url": f"{url}/drain/{{{{ inventory_hostname }}}}", "method": "POST"},
             "delegate_to": "localhost"},
            {"name": "deploy", "release": str(DDTREE)},
            {"name": "smoke test", "fail": "smoke test failed", "when": "inventory_hostname in broken"},
        ],
        "rescue": [{"name": "back on this host", "release": {"state": "rolled_back", "timeout": 60}},
                   {"name": "still a failure", "fail": "smoke test failed: rolled back, counted"}],
        "always": [{"name": "undrain", "uri": {"url": f"{url}/undrain/{{{{ inventory_hostname }}}}",
                                               "method": "POST"}, "delegate_to": "localhost"}],
    }]}]


def test_drain_deploy_undrain_at_a_load_balancer(lab: LabHandle, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with load_balancer(HOSTS) as lb:
        book = playbook(tmp_path, drained_rollout(lb.url, serial=[1, 2, 1], max_fail_percentage=0,
                                                  on_failure="rollback_all"))
        # batch 2 fails on lab3: its rescue rolls it back and fails it, always undrains it, the
        # budget stops the rollout and rollback_all takes lab1 and lab2 back; lab4 is never drained
        bad = run(capsys, lab, str(book), "-e", '{"broken": ["lab3"]}', "--json")
        doc = bad.json()
        assert bad.rc == 2 and doc["status"] == "halted", bad.out + bad.err
        assert lb.pool == set(HOSTS)
        assert "drain lab4" not in lb.log and lb.log.index("undrain lab3") > lb.log.index("drain lab3")
        assert [(r["name"], r["status"]) for r in doc["results"]["lab3"]][-5:] == [
            ("back on this host", "changed"), ("still a failure", "failed"), ("undrain", "changed"),
            ("drain for the rollback", "changed"), ("undrain after the rollback", "changed")]
        events = journal_events(lab, doc["run_id"])
        assert {e["host"] for e in events if e["event"] == "rollback"} == {"lab1", "lab2", "lab3"}
        # rollback_all drains the hosts it restarts and puts them back after (before/after_rollback)
        assert sorted(lb.log[-6:-3]) == ["drain lab1", "drain lab2", "drain lab3"]
        assert sorted(lb.log[-3:]) == ["undrain lab1", "undrain lab2", "undrain lab3"]
        kinds = [e["event"] if e["event"] == "rollback" else e["name"] for e in events
                 if e["event"] == "rollback" or (e["event"] == "task_result" and e["name"] in (
                     "drain for the rollback", "undrain after the rollback"))]
        assert kinds == ["drain for the rollback"] * 3 + ["rollback"] * 3 + ["undrain after the rollback"] * 3
        assert currents(lab) == dict.fromkeys(HOSTS, plain_id())
        assert {serving(lab, h) for h in HOSTS} == {plain_id()}


def test_drain_deploy_undrain_at_a_load_balancer_on_success(lab: LabHandle, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with load_balancer(HOSTS) as lb:
        book = playbook(tmp_path, drained_rollout(lb.url, serial=[1, 2, 1], max_fail_percentage=0,
                                                  on_failure="rollback_all"))
        # every host goes out and comes back, one batch at a time; no rollback, so no rollback hook
        ok = run(capsys, lab, str(book), "-e", '{"broken": []}', "--json")
        assert ok.rc == 0, ok.out + ok.err
        assert lb.pool == set(HOSTS)
        assert lb.log[:2] == ["drain lab1", "undrain lab1"] and sorted(lb.log) == sorted(
            f"{a} {h}" for h in HOSTS for a in ("drain", "undrain"))
        assert currents(lab) == dict.fromkeys(HOSTS, ddtree_id())


def test_a_server_killed_during_the_soak_fails_its_batch(lab: LabHandle, tmp_path: Path) -> None:
    book = playbook(tmp_path, rollout([1, "100%"], pause_between_batches=8, on_failure="rollback_all"))
    proc = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", str(lab.inventory_path), "run",
                             str(book), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = wait_for_event(lab, proc, "batch_end")
    lab.ssh("lab1", KILL_SERVICE)  # the canary's server dies while the rollout soaks
    out, err = proc.communicate(timeout=300)
    doc = json.loads(out)
    assert proc.returncode == 2 and doc["status"] == "halted", err
    events = [json.loads(x) for x in journal.read_text().splitlines()]
    why = next(e["why"] for e in events if e["event"] == "halted")
    assert why.startswith("soak re-check failed after batch 1: lab1: soak re-check: GET /health: the service exited")
    assert not [e for e in events if e["event"] == "batch_start" and e["batch"] == 2]
    assert doc["recap"]["lab1"]["failed"] == 1
    assert currents(lab) == dict.fromkeys(HOSTS, plain_id())  # rollback_all took the canary back
    assert serving(lab, "lab1") == plain_id()


def test_a_server_killed_during_the_last_batchs_soak_fails_it(lab: LabHandle, tmp_path: Path) -> None:
    book = playbook(tmp_path, rollout(1, pause_between_batches=8, on_failure="rollback_all"))
    proc = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", str(lab.inventory_path), "-l",
                             "lab1,lab2", "run", str(book), "--events"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # --events: each event as it happens
        e = json.loads(line)
        if e["event"] == "batch_end" and e["batch"] == 2:
            break
    lab.ssh("lab2", KILL_SERVICE)  # the last batch's server dies while it soaks
    rest, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    events = [json.loads(x) for x in rest.splitlines()]
    why = next(e["why"] for e in events if e["event"] == "halted")
    assert why.startswith("soak re-check failed after batch 2: lab2: soak re-check: GET /health: ")
    assert {e["host"] for e in events if e["event"] == "rollback"} == {"lab1", "lab2"}
    assert events[-1]["event"] == "run_end" and events[-1]["recap"]["lab2"]["failed"] == 1
    assert currents(lab) == dict.fromkeys(HOSTS, plain_id())
    assert serving(lab, "lab2") == plain_id()


def test_min_healthy_counts_a_host_already_down(lab: LabHandle, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    lab.ssh("lab4", STOP_SERVICE)  # down before the rollout starts
    book = playbook(tmp_path, rollout([1, 2], min_healthy=2))
    r = run(capsys, lab, str(book), "--json")
    doc = r.json()
    assert r.rc == 2 and doc["status"] == "halted", r.out + r.err
    events = journal_events(lab, doc["run_id"])
    capacity = [e for e in events if e["event"] == "capacity"]
    assert capacity[0]["down"] == ["lab4"] and capacity[1]["serving"] == ["lab1", "lab2", "lab3"]
    assert next(e["why"] for e in events if e["event"] == "halted") == (
        "min_healthy 2: 3 of 4 host(s) serving, and this batch would leave 1 (needs 2): batch 2 (lab2, lab3) "
        "not started")
    assert currents(lab) == {"lab1": ddtree_id(), "lab2": plain_id(), "lab3": plain_id(), "lab4": plain_id()}
    assert [e["hosts"] for e in events if e["event"] == "batch_start"] == [["lab1"]]


def test_progress_deadline_ends_a_hanging_rollout(lab: LabHandle, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    hang = {"name": "hangs", "shell": "sleep 600", "when": "inventory_hostname == 'lab2'"}
    book = playbook(tmp_path, rollout(1, [hang], progress_deadline=45, on_failure="rollback_all"))
    start = time.monotonic()
    r = run(capsys, lab, str(book), "--json")
    took = time.monotonic() - start
    doc = r.json()
    assert r.rc == 2 and doc["status"] == "halted", r.out + r.err
    events = journal_events(lab, doc["run_id"])
    assert next(e["why"] for e in events if e["event"] == "halted") == (
        "progress_deadline 45s exceeded in batch 2 at task 'hangs' (still running: lab2)")
    assert took < 200
    assert doc["recap"]["lab2"]["failed"] == 1
    # the host stopped at the deadline gets a new connection and is rolled back with the others
    rolled = {e["host"]: e["status"] for e in events if e["event"] == "rollback"}
    assert rolled == {"lab1": "rolled-back", "lab2": "rolled-back"}, events[-6:]
    assert currents(lab) == dict.fromkeys(HOSTS, plain_id())
    assert serving(lab, "lab2") == plain_id()


def test_deploy_stage_then_deploy_only_switches(lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    from cli_support import run_cli

    folder = f"/opt/fleetctl/releases/{ddtree_id()}"
    lab.ssh("lab1", f"rm -rf {folder}")
    staged = run_cli(capsys, "-i", str(lab.inventory_path), "-l", "lab1", "deploy", str(DDTREE), "--stage", "--json")
    assert staged.rc == 0, staged.out + staged.err
    assert current(lab, "lab1") == plain_id() and serving(lab, "lab1") == plain_id()  # nothing switched
    record = json.loads(lab.ssh("lab1", f"cat {folder}/staged.json").stdout)
    assert record["site"] and record["base_fingerprint"] and '"outcome": "staged"' in staged.out
    built_at = lab.ssh("lab1", f"stat -c %Y {folder}/manifest.json").stdout
    live = run_cli(capsys, "-i", str(lab.inventory_path), "-l", "lab1", "deploy", str(DDTREE), "--json")
    assert live.rc == 0, live.out + live.err
    assert '"staged": true' in live.out and '"outcome": "deployed"' in live.out
    assert lab.ssh("lab1", f"stat -c %Y {folder}/manifest.json").stdout == built_at  # the build reused
    assert current(lab, "lab1") == ddtree_id() and serving(lab, "lab1") == ddtree_id()
