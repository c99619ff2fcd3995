"""A multi-node server behind the real gateway (smg 1.13.0) on a 3-host lab: lab1 (rank 0, the group's
only worker) and lab2 (rank 1) are one two-node server, lab3 a server of its own. The stand-in's ranks
join at ``dist_init_addr`` as SGLang's do: rank 0 is 503 until every rank joined, and a rank that goes
away cuts rank 0's streams in flight. So a rank > 0 may stop only once rank 0 has drained, and rank 0
may go back into the gateway only once every rank passed its gates."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import run_cli
from gateway_support import MODEL, processes, start_gateway, stream_once, streaming_load
from lab_support import _NET, LabHandle, lab_usable, private_lab, user_inventory, worker_lab_dir

from fleetctl.gateway.client import Gateway
from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
HOSTS = ["lab1", "lab2", "lab3"]
LAB_DIR = worker_lab_dir("test-lab-gateway-groups")
LAB_BASE = f"127.{_NET}.87.0"
HOLD = "/var/lib/fleetctl/hold-stream"  # a stream whose prompt is "hold" ends only once this exists
GROUPS = {"lab1": "big", "lab2": "big", "lab3": "solo"}


def spec(folder: Path, version: str, *extra: str, health: str = "{timeout: 60, interval: 0.2}") -> Path:
    path = folder / f"gg-{version}.yml"
    args = ["--nnodes", "{{ nnodes }}", "--node-rank", "{{ node_rank }}", "--dist-init-addr", "{{ dist_init_addr }}",
            "--enable-metrics", "--standin-start-delay", "2", "--standin-decode-tps", "50",
            "--standin-hold-file", HOLD, *extra]
    path.write_text(yaml.safe_dump({
        "name": "gg", "version": version, "base": {"adopt": "/root/mn-env"},
        "service": {"standin": True, "node_group": "mn", "args": args, "port": 30000}, "keep_releases": 4},
        sort_keys=False) + f"health: {health}\n")
    return path


@pytest.fixture(scope="module")
def gg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The lab, the gateway, an inventory naming it, every host on release A: lab1 and lab3 its workers."""
    why = lab_usable()
    if why:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("gateway-groups")
    with private_lab(LAB_DIR, 3, LAB_BASE) as lab, processes() as procs:
        for host in HOSTS:
            lab.ssh(host, "/usr/bin/python3 -m venv --without-pip /root/mn-env")
        url = start_gateway(procs, folder / "smg.log")
        inv = user_inventory(lab, folder / "inv.yml", "root",
                             {h: {"mn": GROUPS[h], "router_url": url} for h in HOSTS})
        env = {"lab": lab, "url": url, "inv": inv, "A": spec(folder, "A"), "folder": folder}
        first = subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "-i", str(inv), "-l", "all", "deploy",
                                str(env["A"])], capture_output=True, text=True, timeout=600)
        assert first.returncode == 0, first.stdout + first.stderr
        assert workers(lab, url) == ["lab1", "lab3"]
        yield env


def workers(lab: LabHandle, url: str) -> list[str]:
    """The hosts the gateway routes to (healthy, ready)."""
    by_url = {f"http://{lab.addresses[h]}:30000": h for h in HOSTS}
    return sorted(by_url.get(w.url, w.url) for w in Gateway(url).workers() if w.healthy and w.status == "ready")


def current(lab: LabHandle, host: str) -> str:
    return lab.ssh(host, "basename $(readlink /opt/fleetctl/current)").stdout.strip()


def pids(env: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Each group node's server pid, as ``service status`` says."""
    r = run_cli(capsys, "-i", str(env["inv"]), "-l", "lab1,lab2", "service", "status", "--json")
    assert r.rc == 0, r.out + r.err
    return {h: v["value"]["servers"][0]["pid"] for h, v in r.json()["hosts"].items()}


def running(lab: LabHandle, host: str) -> float:
    text = urllib.request.urlopen(f"http://{lab.addresses[host]}:30000/metrics", timeout=5).read().decode()
    return float(text.split(f'sglang:num_running_reqs{{model_name="{MODEL}"}} ', 1)[1].split()[0])


def held_on_rank_0(env: dict[str, Any]) -> tuple[threading.Thread, list[tuple[int, str]]]:
    """A stream held in flight on lab1 (rank 0): round robin sends one of two there."""
    lab, url = env["lab"], env["url"]
    for _ in range(4):
        for host in HOSTS:
            lab.ssh(host, f"rm -f {HOLD}")
        got: list[tuple[int, str]] = []
        streaming = threading.Thread(target=lambda got=got: got.append(
            stream_once(url, 100, timeout=300, prompt="hold")))
        streaming.start()
        while streaming.is_alive() and not any(running(lab, h) == 1 for h in ("lab1", "lab3")):
            streaming.join(timeout=0.1)
        if running(lab, "lab1") == 1:
            return streaming, got
        lab.ssh("lab3", f"touch {HOLD}")  # it went to lab3: let it finish, try again
        streaming.join(timeout=300)
    raise AssertionError("no stream reached lab1")


def test_a_rank_stops_only_after_rank_0_drained(gg: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """A stream is held in flight on rank 0 while the group restarts, with a drain deadline shorter
    than the hold: rank 0 cannot drain, so rank 1 is not touched either (stopping it would cut the
    stream), and the stream completes in full once let go."""
    lab, url = gg["lab"], gg["url"]
    check = run_cli(capsys, "-i", str(gg["inv"]), "-l", "lab1,lab2", "deploy", str(spec(gg["folder"], "C")), "--check")
    assert check.rc == 0, check.out + check.err
    assert (f"lab2: gateway: would wait for its rank 0: rank 1 stops only once its rank 0 (dist_init_addr "
            f"{lab.addresses['lab1']}:20000) is out and drained") in check.out
    before = pids(gg, capsys)
    assert all(before.values())
    streaming, got = held_on_rank_0(gg)
    short = user_inventory(lab, gg["folder"] / "short.yml", "root", {h: {
        "mn": GROUPS[h], "router_url": url, "router_drain_timeout": 6} for h in HOSTS})
    r = run_cli(capsys, "-i", str(short), "-l", "lab1,lab2", "service", "restart", "-y", "--json")
    assert r.rc == 2, r.out + r.err
    hosts = r.json()["hosts"]
    assert "drain deadline: 1 requests still in flight" in hosts["lab1"]["reason"], hosts
    assert hosts["lab2"]["reason"].startswith("rank 0 (lab1) was not drained (drain deadline"), hosts
    assert streaming.is_alive()  # nothing cut it
    assert pids(gg, capsys) == before  # neither server was touched
    lab.ssh("lab1", f"touch {HOLD}")
    streaming.join(timeout=300)
    assert got == [(100, "")]
    assert workers(lab, url) == ["lab3"]  # lab1 left out, as its result said
    back = run_cli(capsys, "-i", str(gg["inv"]), "-l", "lab1,lab2", "service", "restart", "-y")
    assert back.rc == 0, back.out + back.err
    assert workers(lab, url) == ["lab1", "lab3"]


def test_a_playbook_service_task_stops_rank_1_only_after_rank_0_drained(
        gg: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """The same hold through a playbook: a play grouped by ``serial_group_var`` whose ``service``
    task restarts the group moves it in step as ``service restart`` does (playbook/groupstep.py)."""
    lab, url = gg["lab"], gg["url"]
    before = pids(gg, capsys)
    streaming, got = held_on_rank_0(gg)
    short = user_inventory(lab, gg["folder"] / "short-play.yml", "root", {h: {
        "mn": GROUPS[h], "router_url": url, "router_drain_timeout": 6} for h in HOSTS})
    book = gg["folder"] / "restart.yml"
    book.write_text(yaml.safe_dump([{"name": "restart", "hosts": "lab1,lab2", "serial_group_var": "mn",
                                     "tasks": [{"name": "restart", "service": "restarted"}]}], sort_keys=False))
    r = run_cli(capsys, "-i", str(short), "run", str(book), "--json")
    assert r.rc == 2, r.out + r.err
    said = {h: (e[-1]["status"], e[-1]["msg"]) for h, e in r.json()["results"].items()}
    assert said["lab1"][0] == "failed" and "drain deadline: 1 requests still in flight" in said["lab1"][1], said
    assert said["lab2"][0] == "failed" and said["lab2"][1].startswith(
        "rank 0 (lab1) was not drained (drain deadline"), said
    assert streaming.is_alive()  # nothing cut it
    assert pids(gg, capsys) == before  # neither server was touched
    lab.ssh("lab1", f"touch {HOLD}")
    streaming.join(timeout=300)
    assert got == [(100, "")]
    back = run_cli(capsys, "-i", str(gg["inv"]), "-l", "lab1,lab2", "service", "restart", "-y")
    assert back.rc == 0, back.out + back.err
    assert workers(lab, url) == ["lab1", "lab3"]


def test_a_play_rolling_back_a_group_stops_rank_1_only_after_rank_0_drained(
        gg: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """A play deploys the group (a ``release`` task), then a task fails on rank 1 while a stream is
    held on rank 0: ``on_failure: rollback_failed`` takes the group back in step. With a drain
    deadline shorter than the hold rank 0 cannot drain, so rank 1's server is not touched either
    (stopping it would cut the stream), and the stream completes in full once let go."""
    lab, url = gg["lab"], gg["url"]
    go = "/var/lib/fleetctl/go-fail"  # rank 1's failing task waits for it: the stream is held by then
    lab.ssh("lab2", f"rm -f {go}")
    short = user_inventory(lab, gg["folder"] / "short-roll.yml", "root", {h: {
        "mn": GROUPS[h], "router_url": url, "router_drain_timeout": 6} for h in HOSTS})
    new = spec(gg["folder"], "D")
    book = gg["folder"] / "roll.yml"
    book.write_text(yaml.safe_dump([{
        "name": "roll", "hosts": "lab1,lab2", "serial_group_var": "mn", "on_failure": "rollback_failed",
        "max_fail_percentage": 0, "tasks": [{"name": "deploy", "release": str(new)},
                  {"name": "fail on rank 1", "when": "inventory_hostname == 'lab2'",
                   "shell": f"while [ ! -e {go} ]; do sleep 0.2; done; exit 1"}]}], sort_keys=False))
    play = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", str(short), "run", str(book),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # read in this order: lab1 leaves the gateway before its switch, so lab1 listed after its
        # current reads D means it came back (read the other way round, a listing from before the
        # drain and a current read after the switch would pass mid-deploy)
        while not (current(lab, "lab1") == load_spec(new).release_id
                   and current(lab, "lab2") == load_spec(new).release_id and workers(lab, url) == ["lab1", "lab3"]):
            assert play.poll() is None, play.communicate()
            threading.Event().wait(0.5)
        deployed = pids(gg, capsys)
        streaming, got = held_on_rank_0(gg)
        lab.ssh("lab2", f"touch {go}")
        out, err = play.communicate(timeout=600)
    finally:
        if play.poll() is None:
            play.kill()
    assert play.returncode == 2, out + err
    assert streaming.is_alive(), out  # nothing cut it
    assert pids(gg, capsys) == deployed  # neither server was touched
    lab.ssh("lab1", f"touch {HOLD}")
    streaming.join(timeout=300)
    assert got == [(100, "")]
    journal = [json.loads(line) for line in Path(json.loads(out)["journal"]).read_text().splitlines()]
    back_msgs = {e["host"]: (e["status"], e["msg"]) for e in journal if e["event"] == "rollback" and "host" in e}
    assert set(back_msgs) == {"lab1", "lab2"}, journal
    assert back_msgs["lab1"][0] == "failed" and "drain deadline: 1 requests still in flight" in back_msgs["lab1"][1]
    assert back_msgs["lab2"][0] == "failed" and "rank 0 (lab1) was not drained (drain deadline" in back_msgs["lab2"][1]
    assert workers(lab, url) == ["lab3"]  # rank 0 left out: its group does not serve (docs/guides/deploy.md)
    back = run_cli(capsys, "-i", str(gg["inv"]), "-l", "lab1,lab2", "deploy", "-y", str(gg["A"]))
    assert back.rc == 0, back.out + back.err
    assert workers(lab, url) == ["lab1", "lab3"]


def test_under_streaming_load_a_group_restarts_and_returns_from_a_failed_rank_losing_nothing(
        gg: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """Constant streaming load through the gateway: the group restarts (rank 1 stops only after rank
    0 drained); then a deploy whose rank 1 fails its gate: rank 0, which passed, never goes back into
    the gateway and returns to A with its group. Not one request failed or cut."""
    lab, url = gg["lab"], gg["url"]
    sick = spec(gg["folder"], "B", "--standin-health-status", "{{ 503 if node_rank == 1 else 200 }}",
                health="{timeout: 8, interval: 0.2}")
    with streaming_load(url, clients=4, tokens=40) as tally:
        restart = run_cli(capsys, "-i", str(gg["inv"]), "-l", "all", "service", "restart", "-y", "--serial", "1")
        assert restart.rc == 0, restart.out + restart.err
        r = run_cli(capsys, "-i", str(gg["inv"]), "-l", "all", "deploy", "-y", str(sick), "--serial", "1", "--json")
    assert (tally.failed, tally.truncated) == ([], [])
    assert tally.completed > 0
    assert r.rc == 2, r.out + r.err
    hosts = r.json()["hosts"]
    reason = hosts["lab1"]["reason"]  # rank 0 passed its own gates, then waited for rank 1's: left out
    assert reason.startswith("health gate failed: node group: rank 1 (lab2) failed: GET /health"), reason
    assert f"left out of gateway {url}" in reason and reason.endswith(f"rolled back to {load_spec(gg['A']).release_id}")
    assert {h: current(lab, h) for h in HOSTS} == {h: load_spec(gg["A"]).release_id for h in HOSTS}
    assert workers(lab, url) == ["lab1", "lab3"]
    journal = [json.loads(line) for line in Path(r.json()["journal"]).read_text().splitlines()]
    assert [e["hosts"] for e in journal if e["event"] == "batch_start"][0] == ["lab1", "lab2"]
