"""Rollouts behind the real SGLang gateway (smg 1.13.0, `make deps`), with and without fleetctl's
gateway integration (issue 34): N lab hosts, each stand-in server with a load time (/health 503),
constant streaming load through the gateway (C clients, T-token streams) for the whole run:
`deploy --serial 1` R times (A->B, B->A, ...), then `service restart --serial 2`. Counts streams
completed, failed (no 200) and truncated (fewer tokens than asked), the most workers out of
rotation at once (as the gateway lists them), and the total rollout time.

"without": the inventory has no router_url (today's behaviour); the workers are registered once by
hand, so the gateway routes to servers that are restarted under it.

Run: .venv/bin/python bench/gateway.py [--hosts 8] [--load 20] [--clients 8] [--tokens 200]
                                       [--rollouts 3] [--out bench/gateway-8]   (writes OUT.md, OUT.json;
                                       bench/gateway.md is the curated page: never an OUT)
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import yaml  # noqa: E402
from gateway_support import processes, start_gateway, streaming_load  # noqa: E402
from lab_support import LabHandle  # noqa: E402
from sglang_support import NEW_SGLANG, install_layout  # noqa: E402

from fleetctl.gateway.client import Gateway, GatewayError  # noqa: E402
from fleetctl.lab import lab_down, lab_up  # noqa: E402

LAB = ROOT / ".fleetctl" / "bench-gateway-lab"
BASE = "127.0.94.0"


def spec(folder: Path, version: str, load: float) -> Path:
    path = folder / f"gw-{version}.yml"
    args = ["--enable-metrics", "--standin-start-delay", str(load), "--standin-decode-tps", "100"]
    path.write_text(yaml.safe_dump({
        "name": "gw-bench", "version": version, "base": {"adopt": "/root/ml-env"},
        "requires": {"sglang": "==0.5.23"}, "service": {"standin": True, "args": args, "port": 30000},
        "health": {"timeout": load + 120, "interval": 0.2}, "keep_releases": 3}, sort_keys=False))
    return path


def inventory(lab: LabHandle, router: str | None, name: str) -> Path:
    doc = yaml.safe_load(lab.inventory_path.read_text())
    if router:
        doc["all"]["children"]["lab"]["vars"] = {"router_url": router}
    path = lab.inventory_path.parent / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def fleetctl(inv: Path, *args: str) -> tuple[int, float]:
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "fleetctl.cli.main", "-i", str(inv), "-l", "all", "-y", *args],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
    return r.returncode, time.monotonic() - start


class Watcher:
    """Polls, for a whole half, each server's ``GET /health`` (one thread per worker) and the
    gateway's ``GET /workers`` every ~0.2 s. Records the most expected workers not ready-and-healthy
    in the gateway at once, and per worker per restart (its /health not 200, then 200 again) the
    moment /health turned 200, the first poll that listed it (any status but draining: fleetctl's
    POST /workers landed), the first that listed it ready and healthy, and the gap (200 to ready).
    A /health poll that times out (a busy machine) counts as neither up nor down. The 1-minute load
    average is read every 10 s."""

    def __init__(self, url: str, expected: set[str]) -> None:
        self.gateway, self.expected, self.most = Gateway(url, timeout=5), expected, 0
        self.stop, self.lock, self.step, self.t0 = threading.Event(), threading.Lock(), "", time.monotonic()
        self.waiting: dict[str, dict[str, Any]] = {}  # worker -> its restart not yet back in the gateway
        self.restarts: list[dict[str, Any]] = []
        self.loads: list[float] = []
        self.threads = [threading.Thread(target=self.poll_gateway, daemon=True),
                        *(threading.Thread(target=self.poll_health, args=(w,), daemon=True) for w in expected)]

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)

    def poll_gateway(self) -> None:
        last_load = 0.0
        while not self.stop.is_set():
            if time.monotonic() - last_load >= 10:
                self.loads.append(float(Path("/proc/loadavg").read_text().split()[0]))
                last_load = time.monotonic()
            try:
                workers = self.gateway.workers()
            except GatewayError:
                workers = []
            at, ready = self.now(), {w.url for w in workers if w.healthy and w.status == "ready"}
            with self.lock:
                self.most = max(self.most, len(self.expected - ready))
                for worker in {w.url for w in workers if w.status != "draining"} & set(self.waiting):
                    self.waiting[worker]["listed_at"] = self.waiting[worker]["listed_at"] or at
                for worker in ready & set(self.waiting):
                    event = self.waiting.pop(worker)
                    event["in_gateway_at"], event["gap"] = at, round(at - event["health_200_at"], 2)
            time.sleep(0.2)

    def poll_health(self, worker: str) -> None:
        down = False
        while not self.stop.is_set():
            up = health_up(worker + "/health")
            if up is False:
                down = True
            elif up and down:  # came back: a restart
                down, event = False, {"worker": worker, "step": self.step, "health_200_at": self.now(),
                                      "listed_at": None, "in_gateway_at": None, "gap": None}
                with self.lock:
                    self.restarts.append(event)
                    self.waiting[worker] = event
            time.sleep(0.2)

    def per_step(self) -> list[dict[str, Any]]:
        rows = []
        for step in dict.fromkeys(e["step"] for e in self.restarts):
            back = [e for e in self.restarts if e["step"] == step and e["gap"] is not None]
            gaps = [e["gap"] for e in back]
            listed = [e for e in back if e["listed_at"] is not None]
            rows.append({"step": step, "restarts": sum(1 for e in self.restarts if e["step"] == step),
                         "never_back": sum(1 for e in self.restarts if e["step"] == step and e["gap"] is None),
                         "max_gap": max(gaps, default=None),
                         "median_gap": round(statistics.median(gaps), 2) if gaps else None,
                         "over_5s": sum(1 for g in gaps if g > 5),
                         # the gap's two parts: until fleetctl's POST /workers, then the gateway's own checks
                         "max_to_listed": max((round(e["listed_at"] - e["health_200_at"], 2) for e in listed),
                                              default=None),
                         "max_listed_to_ready": max((round(e["in_gateway_at"] - e["listed_at"], 2) for e in listed),
                                                    default=None)})
        return rows


def health_up(url: str) -> bool | None:
    """True: 200; False: any other status or refused; None: no answer in time (unknown)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except urllib.error.HTTPError:
        return False
    except TimeoutError:
        return None
    except urllib.error.URLError as exc:
        return None if isinstance(exc.reason, TimeoutError) else False
    except OSError:
        return False


def variant(url: str, inv: Path, specs: list[Path], first: int, opts: argparse.Namespace,
            expected: set[str]) -> dict[str, Any]:
    """One run of the rollouts under load, from ``specs[first]`` serving; the workers must be in the
    gateway before it."""
    steps = [("deploy", str(specs[(first + i + 1) % 2]), "--serial", "1") for i in range(opts.rollouts)]
    steps.append(("service", "restart", "--serial", "2"))
    watch, codes, timeline = Watcher(url, expected), [], []
    start = time.monotonic()
    with streaming_load(url, clients=opts.clients, tokens=opts.tokens) as tally:
        watch.start()
        for n, step in enumerate(steps, 1):
            label = f"{n}. deploy {Path(step[1]).stem} --serial 1" if step[0] == "deploy" else f"{n}. {' '.join(step)}"
            watch.step = label
            code, seconds = fleetctl(inv, *step)
            codes.append(code)
            # the running counts at each step's end: which step lost what
            timeline.append({"step": label,
                             "exit": code, "seconds": round(seconds, 1), "at": round(time.monotonic() - start, 1),
                             "completed": tally.completed, "failed": len(tally.failed),
                             "truncated": len(tally.truncated)})
    seconds = round(time.monotonic() - start, 1)
    time.sleep(3)  # the last restart's worker, back in the gateway, is seen before the watch ends
    watch.finish()
    distinct = Counter(tally.failed + tally.truncated)
    loads = watch.loads or [0.0]
    return {"completed": tally.completed, "failed": len(tally.failed), "truncated": len(tally.truncated),
            "seconds": seconds, "max_out": watch.most, "exit_codes": codes,
            "load_avg_1m": {"min": min(loads), "mean": round(statistics.mean(loads), 1), "max": max(loads)},
            "steps": timeline, "back_in_rotation": watch.per_step(), "restarts": watch.restarts,
            "distinct_failures": [{"count": n, "problem": p} for p, n in distinct.most_common()]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--load", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rollouts", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "gateway-8"))  # not "gateway": its .md is the curated page
    opts = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the lab comes down on a kill too (finally)
    folder = LAB.parent / "bench-gateway-files"
    folder.mkdir(parents=True, exist_ok=True)
    specs = [spec(folder, "A", opts.load), spec(folder, "B", opts.load)]
    results: dict[str, Any] = {}
    try:
        lab = LabHandle.from_fleet(lab_up(opts.hosts, LAB, BASE))
        install_layout(lab, dict.fromkeys(lab.hosts, NEW_SGLANG))
        expected = {f"http://{lab.addresses[h]}:30000" for h in lab.hosts}
        with processes() as procs:
            url = start_gateway(procs, folder / "smg.log")
            with_gw, without = inventory(lab, url, "inv-with.yml"), inventory(lab, None, "inv-without.yml")
            assert fleetctl(with_gw, "deploy", str(specs[0]))[0] == 0  # every worker in the gateway, healthy
            results["with"] = variant(url, with_gw, specs, 0, opts, expected)
            report(results, opts)  # written after each half: a run stopped in the second keeps the first
            results["without"] = variant(url, without, specs, opts.rollouts % 2, opts, expected)
    finally:
        lab_down(LAB, purge=True)
        shutil.rmtree(LAB, ignore_errors=True)
    report(results, opts)
    return 0


def report(results: dict[str, Any], opts: argparse.Namespace) -> None:
    lines = [f"# Rollouts behind the SGLang gateway ({time.strftime('%Y-%m-%d')}, smg 1.13.0)", "",
             f"{opts.hosts} lab hosts, {opts.load:g} s load time, {opts.clients} clients streaming {opts.tokens}-token "
             f"completions through the gateway; deploy --serial 1 x{opts.rollouts}, then service restart --serial 2.",
             "", f"Command: `.venv/bin/python bench/gateway.py --hosts {opts.hosts} --load {opts.load:g} "
             f"--clients {opts.clients} --tokens {opts.tokens} --rollouts {opts.rollouts} --out {opts.out}`", "",
             "| fleetctl | completed | failed | truncated | most workers out at once | total s | exit codes "
             "| load avg 1m (min/mean/max) |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for name, r in results.items():
        label = "with router_url (drain, re-add)" if name == "with" else "without (today's behaviour)"
        load = r["load_avg_1m"]
        lines.append(f"| {label} | {r['completed']} | {r['failed']} | {r['truncated']} | {r['max_out']} | "
                     f"{r['seconds']} | {' '.join(map(str, r['exit_codes']))} | "
                     f"{load['min']:g}/{load['mean']:g}/{load['max']:g} |")
    lines += ["", "Back in rotation: per step, the gap from a worker's /health turning 200 to the gateway listing it "
              "ready and healthy (s)", "",
              "| fleetctl | step | exit | step s | restarts | max gap | median gap | over 5 s | never back "
              "| max 200 to listed | max listed to ready |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        gaps = {row["step"]: row for row in r["back_in_rotation"]}
        for step in r["steps"]:
            row = gaps.get(step["step"], {})
            cells = [row.get(k) for k in ("restarts", "max_gap", "median_gap", "over_5s", "never_back",
                                          "max_to_listed", "max_listed_to_ready")]
            lines.append(f"| {name} | {step['step']} | {step['exit']} | {step['seconds']} | "
                         + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    text = "\n".join(lines) + "\n"
    Path(opts.out + ".md").write_text(text)
    Path(opts.out + ".json").write_text(json.dumps(results, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
