"""Rollouts behind the real SGLang gateway (smg 1.13.0) on a 4-host lab: each stand-in server takes 5 s
to load (/health 503), streams one token every 20 ms and serves SGLang's /metrics. Under constant
streaming load through the gateway, deploy --serial 1 A->B and B->A and service restart --serial 2
lose no request and cut no stream; a stream in flight when its host's drain begins completes in
full; a server that fails its gate stays out of the gateway and router status says so; an
unreachable gateway refuses the host before its server is touched; --check shows the steps; rollback
and the playbook release/service modules take the same steps."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli
from gateway_support import MODEL, processes, start_gateway, stream_once, streaming_load
from lab_support import _NET, LabHandle, lab_usable, private_lab, user_inventory, worker_lab_dir
from sglang_support import NEW_SGLANG, make_venv, wheel

from fleetctl.gateway.client import Gateway
from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
HOSTS = ["lab1", "lab2", "lab3", "lab4"]
GW_LAB_DIR = worker_lab_dir("test-lab-gateway")
GW_LAB_BASE = f"127.{_NET}.86.0"
HOLD = "/var/lib/fleetctl/hold-stream"  # a stream whose prompt is "hold" ends only once this exists


def spec(folder: Path, version: str, *extra: str, health: str = "{timeout: 60, interval: 0.2}") -> Path:
    path = folder / f"gw-{version}.yml"
    args = ["--enable-metrics", "--standin-start-delay", "5", "--standin-decode-tps", "50",
            "--standin-hold-file", HOLD, *extra]
    path.write_text(yaml.safe_dump({
        "name": "gw", "version": version, "base": {"adopt": "/root/ml-env"}, "requires": {"sglang": "==0.5.23"},
        "service": {"standin": True, "args": args, "port": 30000}, "keep_releases": 4}, sort_keys=False)
        + f"health: {health}\n")
    return path


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The lab, the real gateway in front of it, an inventory naming it (router_url), and every host
    on release A, each worker healthy in the gateway."""
    why = lab_usable()
    if why:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("gateway")
    with private_lab(GW_LAB_DIR, 4, GW_LAB_BASE) as lab, processes() as procs:
        whl = wheel("sglang", NEW_SGLANG)
        for host in HOSTS:
            make_venv(lab, host, "/root/ml-env", [whl])
        url = start_gateway(procs, folder / "smg.log")
        inventory = with_router(lab, url, "inventory-gateway.yml")
        env = {"lab": lab, "url": url, "inv": inventory, "A": spec(folder, "A"), "B": spec(folder, "B"),
               "sick": spec(folder, "sick", "--standin-health-status", "503", health="{timeout: 8, interval: 0.2}"),
               "folder": folder}
        first = subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "-i", str(inventory), "-l", "all",
                                "deploy", str(env["A"])], capture_output=True, text=True, timeout=600)
        assert first.returncode == 0, first.stdout + first.stderr
        yield env


def with_router(lab: LabHandle, url: str, name: str) -> Path:
    """The lab's inventory with router_url set for group lab (beside it: the key path is relative)."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["all"]["children"]["lab"]["vars"] = {"router_url": url}
    path = lab.inventory_path.parent / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def fleet_cli(env: dict[str, Any], limit: str, *args: str, inventory: Path | None = None) -> CliRun:
    return run_cli(env["capsys"], "-i", str(inventory or env["inv"]), "-l", limit, *args)


@pytest.fixture
def lab_gw(gw: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> Iterator[dict[str, Any]]:
    gw["capsys"] = capsys
    yield gw
    gw.pop("capsys", None)


def healthy_workers(url: str) -> list[str]:
    return sorted(w.url for w in Gateway(url).workers() if w.healthy and w.status == "ready")


def expected_workers(lab: LabHandle) -> list[str]:
    return sorted(f"http://{lab.addresses[h]}:30000" for h in HOSTS)


def current(lab: LabHandle, host: str) -> str:
    return lab.ssh(host, "basename $(readlink /opt/fleetctl/current)").stdout.strip()


def test_rollouts_under_streaming_load_lose_nothing(lab_gw: dict[str, Any]) -> None:
    lab, url = lab_gw["lab"], lab_gw["url"]
    assert healthy_workers(url) == expected_workers(lab)
    with streaming_load(url, clients=4, tokens=40) as tally:
        for args in (("deploy", str(lab_gw["B"]), "--serial", "1"), ("deploy", str(lab_gw["A"]), "--serial", "1"),
                     ("service", "restart", "--serial", "2")):
            r = fleet_cli(lab_gw, "all", *args, "--json")
            assert r.rc == 0, r.out + r.err
    assert (tally.failed, tally.truncated) == ([], [])
    assert tally.completed > 0
    assert healthy_workers(url) == expected_workers(lab)
    assert {current(lab, h) for h in HOSTS} == {load_spec(lab_gw["A"]).release_id}


def test_a_stream_in_flight_when_its_drain_begins_completes(lab_gw: dict[str, Any]) -> None:
    """A stream goes where the gateway sends it and holds its last token (the stand-in's hold file);
    its host restarts meanwhile: once the drain has begun (the gateway stopped routing to the
    worker) the stream is let go, gets every token, and only then does the server restart."""
    lab, url = lab_gw["lab"], lab_gw["url"]
    for host in HOSTS:
        lab.ssh(host, f"rm -f {HOLD}")
    got: list[tuple[int, str]] = []
    streaming = threading.Thread(target=lambda: got.append(stream_once(url, 100, timeout=300, prompt="hold")))
    streaming.start()
    host = busy_host(lab, streaming)
    mine = f"http://{lab.addresses[host]}:30000"
    restart = subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", str(lab_gw["inv"]), "-l", host,
                                "service", "restart", "--json"], stdout=subprocess.PIPE, text=True)
    while any(w.url == mine and w.status != "draining" for w in Gateway(url).workers()):
        assert restart.poll() is None, restart.communicate()
    assert running(lab, host) == 1  # the drain waits for the stream
    lab.ssh(host, f"touch {HOLD}")
    out, _ = restart.communicate(timeout=600)
    streaming.join(timeout=300)
    assert restart.returncode == 0, out
    assert got == [(100, "")]
    gates = json.loads(out)["hosts"][host]["value"]["gates"]
    drained = next(g for g in gates if g["name"] == "gateway: drained")
    assert "waited for 1 to finish" in drained["detail"]
    assert healthy_workers(url) == expected_workers(lab)


def running(lab: LabHandle, host: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://{lab.addresses[host]}:30000/metrics", timeout=5).read().decode()
    return float(text.split(f'sglang:num_running_reqs{{model_name="{MODEL}"}} ', 1)[1].split()[0])


def busy_host(lab: LabHandle, streaming: threading.Thread) -> str:
    """The host whose server runs the one stream in flight (its /metrics say so); held, the stream
    stays in flight until the test lets it go."""
    while streaming.is_alive():
        for host in HOSTS:
            if running(lab, host) == 1:
                return host
    raise AssertionError("the stream ended before any server ran it")


def test_a_server_failing_its_gate_stays_out_and_router_status_says_so(lab_gw: dict[str, Any]) -> None:
    lab, url = lab_gw["lab"], lab_gw["url"]
    mine = f"http://{lab.addresses['lab1']}:30000"
    bad = fleet_cli(lab_gw, "lab1", "deploy", str(lab_gw["sick"]), "--json")
    assert bad.rc == 2, bad.out + bad.err
    value = bad.json()["hosts"]["lab1"]["value"]
    assert value["outcome"] == "rolled-back"
    assert value["gates"][-1] == {"name": "gateway", "ok": False, "seconds": 0.0, "numbers": None,
                                  "detail": f"worker {mine} left out of gateway {url}"}
    assert mine not in healthy_workers(url) and len(healthy_workers(url)) == 3
    status = fleet_cli(lab_gw, "all", "router", "status", "--json")
    assert status.rc == 1, status.out + status.err
    rows = {w["url"]: w for g in status.json()["gateways"] for w in g["workers"]}
    assert (rows[mine]["host"], rows[mine]["status"], rows[mine]["serving"]) == ("lab1", "out", False)
    assert rows[mine]["why"].startswith("not registered: left out by a change that failed")
    assert sorted(u for u, w in rows.items() if w["serving"]) == [u for u in expected_workers(lab) if u != mine]
    page = fleet_cli(lab_gw, "all", "report", "--json")  # the fleet page: the same, beside each host
    assert page.rc in (0, 1), page.out + page.err
    doc = page.json()
    judged = {r["host"]: r["gateway"] for r in doc["hosts"]}
    assert judged["lab1"]["level"] == "amber"
    assert judged["lab1"]["text"].startswith(f"{mine} out in {url}: not registered: left out by a change that failed")
    assert {h: v["level"] for h, v in judged.items() if h != "lab1"} == {h: "green" for h in HOSTS[1:]}
    assert [(g["url"], sorted(w["url"] for w in g["workers"])) for g in doc["gateways"]] == [
        (url, expected_workers(lab))]
    back = fleet_cli(lab_gw, "lab1", "service", "restart")  # serving the previous release: back in
    assert back.rc == 0, back.out + back.err
    assert healthy_workers(url) == expected_workers(lab)
    assert fleet_cli(lab_gw, "all", "router", "status").rc == 0


def test_an_unreachable_gateway_refuses_the_host_untouched(lab_gw: dict[str, Any]) -> None:
    lab = lab_gw["lab"]
    closed = with_router(lab, "http://127.0.0.1:9", "inventory-gateway-closed.yml")
    before = lab.ssh("lab1", "cat /var/lib/fleetctl/service/sglang.pid").stdout
    r = fleet_cli(lab_gw, "lab1", "service", "restart", "--json", inventory=closed)
    assert r.rc == 2
    reason = r.json()["hosts"]["lab1"]["reason"]
    assert "gateway http://127.0.0.1:9 unreachable" in reason and "refused before its server was touched" in reason
    assert lab.ssh("lab1", "cat /var/lib/fleetctl/service/sglang.pid").stdout == before


def test_check_shows_the_gateway_steps(lab_gw: dict[str, Any]) -> None:
    lab, url = lab_gw["lab"], lab_gw["url"]
    r = fleet_cli(lab_gw, "lab2", "deploy", str(lab_gw["B"]), "--check")
    assert r.rc == 0, r.out + r.err
    mine = f"http://{lab.addresses['lab2']}:30000"
    assert f"lab2: gateway: would take out of {url}: {mine} (registered), then wait for 0 requests in flight" in r.out
    assert f"lab2: gateway: would add back to {url}: {mine} once its gates pass" in r.out
    restart = fleet_cli(lab_gw, "lab2", "service", "restart", "--check")  # the CLI's service check says them too
    assert restart.rc == 0, restart.out + restart.err
    assert f"lab2: gateway: would take out of {url}: {mine} (registered), then wait for 0 requests" in restart.out
    assert f"lab2: gateway: would add back to {url}: {mine} once its gates pass" in restart.out
    stop = fleet_cli(lab_gw, "lab2", "service", "stop", "--check", "--json")  # a stop leaves it out
    assert [g["name"] for g in stop.json()["hosts"]["lab2"]["value"]["gates"]] == [f"gateway: would take out of {url}"]
    start = fleet_cli(lab_gw, "lab2", "service", "start", "--check", "--json")  # running: nothing to do
    assert start.json()["hosts"]["lab2"]["value"]["gates"] == []
    assert healthy_workers(url) == expected_workers(lab)


def play(lab_gw: dict[str, Any], name: str, tasks: list[dict[str, Any]], *extra: str) -> CliRun:
    book = lab_gw["folder"] / f"{name}.yml"
    book.write_text(yaml.safe_dump([{"name": name, "hosts": "lab4", "tasks": tasks}], sort_keys=False))
    return fleet_cli(lab_gw, "all", "run", str(book), "--json", *extra)


def test_rollback_and_the_playbook_modules_go_through_the_gateway(lab_gw: dict[str, Any]) -> None:
    lab, url = lab_gw["lab"], lab_gw["url"]
    mine = f"http://{lab.addresses['lab4']}:30000"
    steps = [f"gateway: out of {url}", "gateway: drained", f"gateway: back in {url}"]
    plan = play(lab_gw, "deploy-check", [{"name": "deploy", "release": str(lab_gw["B"])}], "--check")
    assert plan.rc == 0, plan.out + plan.err
    assert f"gateway: would take out of {url}: {mine} (registered)" in plan.json()["results"]["lab4"][0]["msg"]
    deployed = play(lab_gw, "deploy", [{"name": "deploy", "release": str(lab_gw["B"])}])
    assert deployed.rc == 0, deployed.out + deployed.err
    assert [g["name"] for g in deployed.json()["results"]["lab4"][0]["data"]["gates"] if "gateway" in g["name"]] \
        == steps
    assert current(lab, "lab4") == load_spec(lab_gw["B"]).release_id
    assert healthy_workers(url) == expected_workers(lab)

    back = fleet_cli(lab_gw, "lab4", "rollback", "--json")
    assert back.rc == 0, back.out + back.err
    assert [g["name"] for g in back.json()["hosts"]["lab4"]["value"]["gates"] if "gateway" in g["name"]] == steps
    assert current(lab, "lab4") == load_spec(lab_gw["A"]).release_id
    assert healthy_workers(url) == expected_workers(lab)

    restarted = play(lab_gw, "restart", [{"name": "restart", "service": "restarted"}])
    assert restarted.rc == 0, restarted.out + restarted.err
    assert [g["name"] for g in restarted.json()["results"]["lab4"][0]["data"]["gateway"]] == steps
    assert healthy_workers(url) == expected_workers(lab)


def ddtree_spec(folder: Path) -> Path:
    """The shipped lab DDTree release, serving the model the load asks for (smg routes by model), its
    patch series found from here; no canary (the load shares this 2-core machine with the timing)."""
    shipped = Path(__file__).resolve().parent.parent / "playbooks" / "releases" / "ddtree-sglang-0.5.23-lab.yml"
    doc = yaml.safe_load(shipped.read_text())
    args = doc["service"]["args"]
    del args[args.index("--model-path"):args.index("--model-path") + 2]
    doc["patches"] = [{"series": str((shipped.parent / p["series"]).resolve())} for p in doc["patches"]]
    doc["health"].pop("canary")
    path = folder / "ddtree-gw.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_shipped_ddtree_playbooks_drain_through_the_gateway(lab_gw: dict[str, Any]) -> None:
    """playbooks/deploy-ddtree.yml (staged, then canary-first) and playbooks/rollback.yml as shipped,
    with router_url in the inventory: every host out, drained, back in; not one request lost."""
    lab, url = lab_gw["lab"], lab_gw["url"]
    playbooks = Path(__file__).resolve().parent.parent / "playbooks"
    ddtree = ddtree_spec(lab_gw["folder"])
    with streaming_load(url, clients=2, tokens=20) as tally:
        rolled = fleet_cli(lab_gw, "all", "run", str(playbooks / "deploy-ddtree.yml"), "-e", "target=lab",
                           "-e", f"release_spec={ddtree}", "--json")
        assert rolled.rc == 0, rolled.out + rolled.err
        back = fleet_cli(lab_gw, "all", "run", str(playbooks / "rollback.yml"), "-e", "target=lab", "--json")
        assert back.rc == 0, back.out + back.err
    assert (tally.failed, tally.truncated) == ([], [])
    assert tally.completed > 0
    for host in HOSTS:
        deployed = next(r for r in rolled.json()["results"][host] if r["name"].startswith("deploy the release"))
        mine = f"http://{lab.addresses[host]}:30000"
        steps = [(g["name"], g["detail"]) for g in deployed["data"]["gates"] if g["name"].startswith("gateway")]
        assert [name for name, _ in steps] == [f"gateway: out of {url}", "gateway: drained", f"gateway: back in {url}"]
        assert steps[0][1] == f"{mine} removed" and steps[2][1] == f"{mine} healthy"
        assert steps[1][1].startswith(f"{mine}: 0 requests in flight")  # read from its /metrics
    assert {current(lab, h) for h in HOSTS} == {load_spec(lab_gw["A"]).release_id}
    assert healthy_workers(url) == expected_workers(lab)


def test_a_drain_as_a_non_root_operator_with_become(lab_gw: dict[str, Any]) -> None:
    """Production's login: fleetop with sudo (-b). Without -b the host is refused before its worker
    leaves the gateway; with -b, under streaming load, each server is out, drained (its /metrics read
    on the host), restarted and back in, and not one request is lost."""
    lab, url = lab_gw["lab"], lab_gw["url"]
    fleetop = user_inventory(lab, lab.inventory_path.parent / "inventory-gateway-fleetop.yml",
                             host_vars={h: {"router_url": url} for h in HOSTS})
    before = lab.ssh("lab2", "cat /var/lib/fleetctl/service/sglang.pid").stdout
    refused = fleet_cli(lab_gw, "lab2", "service", "restart", "--json", inventory=fleetop)
    assert refused.rc == 2, refused.out + refused.err
    assert "--become" in refused.json()["hosts"]["lab2"]["reason"]
    assert healthy_workers(url) == expected_workers(lab)  # nothing taken out of the gateway
    assert lab.ssh("lab2", "cat /var/lib/fleetctl/service/sglang.pid").stdout == before
    with streaming_load(url, clients=2, tokens=20) as tally:
        became = run_cli(lab_gw["capsys"], "-i", str(fleetop), "-b", "-l", "lab2,lab3", "service", "restart",
                         "--serial", "1", "--json")
        assert became.rc == 0, became.out + became.err
    assert (tally.failed, tally.truncated) == ([], [])
    for host in ("lab2", "lab3"):
        mine = f"http://{lab.addresses[host]}:30000"
        gates = {g["name"]: g["detail"] for g in became.json()["hosts"][host]["value"]["gates"]}
        assert gates[f"gateway: out of {url}"] == f"{mine} removed"
        assert gates["gateway: drained"].startswith(f"{mine}: 0 requests in flight")
        assert gates[f"gateway: back in {url}"] == f"{mine} healthy"
    assert lab.ssh("lab2", "cat /var/lib/fleetctl/service/sglang.pid").stdout != before
    assert healthy_workers(url) == expected_workers(lab)
