"""A synthetic fleet as ``report_data.gather`` would find it (no host): the unit tests of the report,
and the page the benchmark and the screenshots render. Host-side strings carry hostile markup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpu_fixtures import H200_XML, derive, raw_smi

from fleetctl.drift.audit import Dist, HostInventory
from fleetctl.gpu.health import Thresholds, evaluate
from fleetctl.gpu.smi import parse_gpu_facts
from fleetctl.release.manage import HostStatus
from fleetctl.report import data as report_data
from fleetctl.report.runs import view
from fleetctl.transport.base import HostResult, Status

EVIL = '<script>alert("x")</script><img src=http://evil.example/x.png>'
T0 = 1_750_000_000.0  # the first release switch
NOW = T0 + 7 * 86400
VERSIONS = {"sglang": "0.5.23", "torch": "2.9.1", "flashinfer-python": "0.7.2", "triton": "3.5.1"}


def inventory(host: str, versions: dict[str, str]) -> HostInventory:
    dists = {n: [Dist(n, v, f"{n}-{v}.dist-info", "pip", None, ())] for n, v in versions.items()}
    markers = {"python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64",
               "python_full_version": "3.11.2", "implementation_name": "cpython", "os_name": "posix"}
    return HostInventory(host, "/root/ml-env", "/root/ml-env/bin/python", {"python": "3.11.2"}, markers, dists)


def history(*releases: tuple[float, str | None, str, str]) -> list[dict[str, Any]]:
    return [{"time": t, "from": a, "to": b, "reason": why, "who": "ops@ctl pid 1"} for t, a, b, why in releases]


def host(name: str, versions: dict[str, str] | None = None, xml: str = H200_XML, current: str | None = "plain-1",
         running: bool = True, health: str = "200", hist: list[dict[str, Any]] | None = None) -> HostResult[Any]:
    g = report_data.HostGathered(name)
    g.release = HostStatus(name, current, "old-0" if current else None, [r for r in (current, "old-0") if r],
                           {"running": running, "pid": 4242 if running else None}, health if running else "-")
    g.history = hist if hist is not None else history((T0, None, "old-0", "deploy"), (T0 + 3 * 86400, "old-0",
                                                                                       "plain-1", "deploy"))
    facts = parse_gpu_facts(raw_smi(xml))
    g.gpu = evaluate(facts, Thresholds(gpus_expected=1, gpu_model="H200"), name)
    g.gpu_models = [gpu.name for gpu in facts.gpus]
    g.inventory = inventory(name, versions or VERSIONS)
    return HostResult(name, Status.OK, g)


def journal(run_id: str, rolled_back: str, ok: str) -> list[dict[str, Any]]:
    """A rollout over ``ok`` (canary) then ``rolled_back`` whose health gate failed: rolled back on the host."""
    def ev(ts: float, kind: str, **f: Any) -> dict[str, Any]:
        return {"ts": T0 + 6 * 86400 + ts, "event": kind, **f}
    gates = [{"name": "health", "ok": True, "detail": "200 after 2.1 s", "seconds": 2.1}]
    return [
        ev(0, "run_start", playbook="playbooks/deploy-ddtree.yml", check=False),
        ev(1, "batch_start", play=0, batch=1, batches=2, hosts=[ok]),
        ev(9, "task_result", play=0, task=0, name="deploy", host=ok, status="changed", msg="deployed ddtree-2",
           changed=True, rolled_back=False, release="ddtree-2", data={"gates": gates}),
        ev(9, "host_done", play=0, host=ok, status="ok"),
        ev(9.5, "batch_end", play=0, batch=1, failed=[]),
        ev(10, "batch_start", play=0, batch=2, batches=2, hosts=[rolled_back]),
        ev(30, "task_result", play=0, task=0, name="deploy", host=rolled_back, status="failed",
           msg=f"health gate failed: health: 503 {EVIL}; rolled back to plain-1", changed=True, rolled_back=True,
           release="plain-1"),
        ev(30, "host_done", play=0, host=rolled_back, status="failed"),
        ev(30.5, "batch_end", play=0, batch=2, failed=[rolled_back]),
        ev(31, "run_end", status="failed", exit_code=2, recap={}),
    ]


def fleet(tmp: Path, n_green: int = 1) -> report_data.Gathered:
    """good*: green; stale: sglang 0.5.9; redgpu: row remapping pending and a rolled-back rollout;
    down: unreachable; stopped: its service is not running."""
    runs = tmp / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    run_id = "20250621-120000-deploy-ddtree"
    (runs / f"{run_id}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in journal(run_id, "redgpu", "good1")))
    hosts = {f"good{i}": host(f"good{i}") for i in range(1, n_green + 1)}
    hosts["stale"] = host("stale", {**VERSIONS, "sglang": "0.5.9", "evil-pkg": EVIL})
    hosts["redgpu"] = host("redgpu", xml=derive("remap-pending"), hist=history(
        (T0, None, "old-0", "deploy"), (T0 + 3 * 86400, "old-0", "plain-1", EVIL),
        (T0 + 6 * 86400 + 20, "plain-1", "ddtree-2", "deploy"),
        (T0 + 6 * 86400 + 29, "ddtree-2", "plain-1", "health gate failed for ddtree-2")))
    hosts["stopped"] = host("stopped", running=False)
    hosts["down"] = HostResult("down", Status.UNREACHABLE, reason="ssh: connect to host 10.0.0.9 port 22: timed out")
    names = sorted(hosts)
    request = report_data.ReportRequest(
        {n: Thresholds(gpus_expected=1, gpu_model="H200") for n in names},
        {n: (["gpu", "canary"] if n == "good1" else ["gpu"]) for n in names}, runs)
    ordered = {n: hosts[n] for n in names}
    return report_data.Gathered(request, ordered, report_data.audit(ordered, request),
                                [view(run_id, journal(run_id, "redgpu", "good1"))])
