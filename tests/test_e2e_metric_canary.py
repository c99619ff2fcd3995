"""Gates on SGLang's Prometheus metrics, on a 3-host lab behind the real gateway (smg 1.13.0) under constant
streaming load: a release whose stand-in takes 1.5 s more to its first token passes a threshold on
sglang:num_queue_reqs, then fails its live TTFT-p99 canary against the two hosts still on the release
before (their numbers and its own in the result), and is rolled back; --check names the metrics read."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import run_cli
from gateway_support import processes, start_gateway, streaming_load
from lab_support import _NET, lab_usable, private_lab, user_inventory, worker_lab_dir
from sglang_support import NEW_SGLANG, make_venv, wheel

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
HOSTS = ["lab1", "lab2", "lab3"]
LAB_DIR = worker_lab_dir("test-lab-metric-canary")
LAB_BASE = f"127.{_NET}.88.0"
HEALTH = {"timeout": 60, "interval": 0.2,
          # The rate is read in rotation: behind the gateway a drained worker has no traffic until then.
          "thresholds": [{"metric": "sglang:num_queue_reqs", "max": 0},
                         {"metric": "sglang:num_requests_total", "rate": True, "window": 4, "min": 0.01}],
          "canary": {"baseline": {"window": 6, "checks": [{"measure": "ttft", "quantile": 0.99, "max_ratio": 1.5},
                                                          {"measure": "error_rate", "max_ratio": 2}]}}}


def spec(folder: Path, version: str, prefill: float, ratio: float = 1.5, loaded: bool = True) -> Path:
    """``loaded``: deployed under load (the rate threshold needs requests; the fixture's first deploy has none)."""
    path = folder / f"mc-{version}.yml"
    args = ["--enable-metrics", "--standin-decode-tps", "50", "--standin-prefill-delay", str(prefill)]
    health = yaml.safe_load(yaml.safe_dump(HEALTH))
    health["canary"]["baseline"]["checks"][0]["max_ratio"] = ratio
    health["thresholds"] = health["thresholds"][:2 if loaded else 1]
    path.write_text(yaml.safe_dump({
        "name": "mc", "version": version, "base": {"adopt": "/root/ml-env"}, "requires": {"sglang": "==0.5.23"},
        "service": {"standin": True, "args": args, "port": 30000}, "health": health}, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def lab_mc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every host on release A (first token at once) behind the gateway (router_url)."""
    why = lab_usable()
    if why:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("metric-canary")
    with private_lab(LAB_DIR, len(HOSTS), LAB_BASE) as lab, processes() as procs:
        whl = wheel("sglang", NEW_SGLANG)
        for host in HOSTS:
            make_venv(lab, host, "/root/ml-env", [whl])
        url = start_gateway(procs, folder / "smg.log")
        doc = yaml.safe_load(lab.inventory_path.read_text())
        doc["all"]["children"]["lab"]["vars"] = {"router_url": url}
        inventory = lab.inventory_path.parent / "inventory-metric-canary.yml"
        inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
        env = {"lab": lab, "url": url, "inv": inventory, "A": spec(folder, "A", 0.0, loaded=False),
               "slow": spec(folder, "B", 1.5),
               # As fast as A: its p99 stays far under 20x A's on a busy machine too.
               "same": spec(folder, "C", 0.0, ratio=20)}
        first = subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "-i", str(inventory), "-l", "all",
                                "deploy", str(env["A"])], capture_output=True, text=True, timeout=600)
        assert first.returncode == 0, first.stdout + first.stderr
        yield env


def current(env: dict[str, Any], host: str) -> str:
    return str(env["lab"].ssh(host, "basename $(readlink /opt/fleetctl/current)").stdout.strip())


def test_check_names_the_metrics_the_gates_would_read(lab_mc: dict[str, Any],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(lab_mc["inv"]), "-l", "lab1", "deploy", str(lab_mc["slow"]), "--check")
    assert r.rc == 0, r.out + r.err
    assert "lab1: threshold: would read: GET /metrics on port 30000: sglang:num_queue_reqs <= 0\n" in r.out
    assert ("lab1: threshold: would read: GET /metrics on port 30000: rate(sglang:num_requests_total[4s]) >= 0.01 "
            "(in rotation, after the other gates)") in r.out
    assert ("lab1: canary: would compare: GET /metrics on port 30000 and on the run's hosts still on the previous "
            "release, 6s apart: ttft p99 at most 1.5x, error rate at most 2x (sglang:num_requests_total, "
            "sglang:time_to_first_token_seconds_bucket, sglang:num_aborted_requests_total)") in r.out


def test_a_slower_first_token_fails_the_live_canary_against_the_old_hosts_and_rolls_back(
        lab_mc: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    old = load_spec(lab_mc["A"]).release_id
    with streaming_load(lab_mc["url"], clients=4, tokens=20) as tally:
        r = run_cli(capsys, "-i", str(lab_mc["inv"]), "-l", "all", "deploy", str(lab_mc["slow"]), "--serial", "1",
                    "--json")
    assert r.rc == 2, r.out + r.err
    doc = r.json()
    value = doc["hosts"]["lab1"]["value"]
    assert value["outcome"] == "rolled-back"
    gates = {g["name"]: g for g in value["gates"]}
    assert gates["sglang:num_queue_reqs <= 0"]["ok"]
    assert gates["sglang:num_queue_reqs <= 0"]["detail"] == "sglang:num_queue_reqs = 0"
    names = [g["name"] for g in value["gates"]]
    rotation = f"gateway: in rotation for the live gates: {lab_mc['url']}"
    rate = "rate(sglang:num_requests_total[4s]) >= 0.01"
    assert names.index("sglang:num_queue_reqs <= 0") < names.index(rotation) < names.index(rate)
    assert gates[rate]["ok"] and float(gates[rate]["detail"].split(" = ")[1]) > 0
    canary = gates[f"canary vs hosts on {old}"]
    assert names.index(rate) < names.index(canary["name"]) < names.index("gateway")  # then out again, left out
    assert not canary["ok"]
    # The canary's first tokens take 1.5 s more: its p99 is in SGLang's (1, 2] s bucket, the old hosts' far below.
    assert "ttft p99 " in canary["detail"] and "s on the canary vs " in canary["detail"]
    assert "on lab2, lab3 (" in canary["detail"] and "at most 1.5x)" in canary["detail"]
    ratio = float(canary["detail"].split("on lab2, lab3 (")[1].split("x")[0])
    assert ratio > 1.5
    assert [h for h in HOSTS if current(lab_mc, h) == old] == HOSTS  # lab1 back; lab2, lab3 never started
    assert "lab2" in (doc.get("halted") or "") or doc["hosts"]["lab2"]["reason"].startswith("not started")
    assert (tally.failed, tally.truncated) == ([], [])


def test_a_canary_as_fast_as_the_old_hosts_passes_each_against_the_hosts_not_yet_switched(
        lab_mc: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    old, new = load_spec(lab_mc["A"]).release_id, load_spec(lab_mc["same"]).release_id
    with streaming_load(lab_mc["url"], clients=4, tokens=20) as tally:
        r = run_cli(capsys, "-i", str(lab_mc["inv"]), "-l", "all", "deploy", str(lab_mc["same"]), "--serial", "1",
                    "--json")
    assert r.rc == 0, r.out + r.err
    details = {h: {g["name"]: g for g in r.json()["hosts"][h]["value"]["gates"]}[f"canary vs hosts on {old}"]["detail"]
               for h in HOSTS}
    assert "s on the canary vs " in details["lab1"] and " on lab2, lab3 (" in details["lab1"]
    assert " on lab3 (" in details["lab2"] and "lab1" not in details["lab2"]  # lab1 runs the new release by then
    assert details["lab3"] == f"no other host of this run serves {old}: nothing to compare with"
    assert [current(lab_mc, h) for h in HOSTS] == [new] * 3
    assert (tally.failed, tally.truncated) == ([], [])


def test_the_playbook_release_module_compares_its_canary_with_the_plays_hosts_still_on_the_old_release(
        lab_mc: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    before = current(lab_mc, "lab1")
    assert [current(lab_mc, h) for h in HOSTS] == [before] * 3
    book = tmp_path / "canary.yml"
    book.write_text(yaml.safe_dump([{"name": "slow", "hosts": "all", "serial": 1,
                                     "tasks": [{"name": "deploy", "release": str(lab_mc["slow"])}]}], sort_keys=False))
    with streaming_load(lab_mc["url"], clients=4, tokens=20) as tally:
        r = run_cli(capsys, "-i", str(lab_mc["inv"]), "-l", "all", "run", str(book), "--json")
    assert r.rc == 2, r.out + r.err
    gates = {g["name"]: g for g in r.json()["results"]["lab1"][0]["data"]["gates"]}
    canary = gates[f"canary vs hosts on {before}"]
    assert not canary["ok"] and "on lab2, lab3 (" in canary["detail"], canary
    assert [current(lab_mc, h) for h in HOSTS] == [before] * 3
    assert (tally.failed, tally.truncated) == ([], [])


def test_the_live_canary_as_a_non_root_operator_with_become(lab_mc: dict[str, Any],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Production's login: fleetop with sudo (-b). The canary's metrics are read on the hosts as root
    through sudo, compared with the host still on the old release, and the slow release rolls back."""
    lab = lab_mc["lab"]
    before = current(lab_mc, "lab1")
    fleetop = user_inventory(lab, lab_mc["inv"].parent / "inventory-metric-canary-fleetop.yml",
                             host_vars={h: {"router_url": lab_mc["url"]} for h in HOSTS})
    with streaming_load(lab_mc["url"], clients=4, tokens=20) as tally:
        r = run_cli(capsys, "-i", str(fleetop), "-b", "-l", "lab1,lab2", "deploy", str(lab_mc["slow"]),
                    "--serial", "1", "--json")
    assert r.rc == 2, r.out + r.err
    value = r.json()["hosts"]["lab1"]["value"]
    canary = {g["name"]: g for g in value["gates"]}[f"canary vs hosts on {before}"]
    assert not canary["ok"] and "on lab2 (" in canary["detail"], canary
    assert value["outcome"] == "rolled-back"
    assert [current(lab_mc, h) for h in HOSTS] == [before] * 3
    assert (tally.failed, tally.truncated) == ([], [])
