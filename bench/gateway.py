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
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import yaml  # noqa: E402
from gateway_support import processes, start_gateway, streaming_load  # noqa: E402
from lab_support import LabHandle  # noqa: E402
from sglang_support import NEW_SGLANG, install_layout  # noqa: E402

from fleetctl.gateway.client import Gateway  # noqa: E402
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


class OutMeter:
    """The most expected workers not ready-and-healthy in the gateway at once (polled)."""

    def __init__(self, url: str, expected: set[str]) -> None:
        self.gateway, self.expected, self.most = Gateway(url), expected, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            ready = {w.url for w in self.gateway.workers() if w.healthy and w.status == "ready"}
            self.most = max(self.most, len(self.expected - ready))
            time.sleep(0.2)


def variant(url: str, inv: Path, specs: list[Path], first: int, opts: argparse.Namespace,
            expected: set[str]) -> dict[str, Any]:
    """One run of the rollouts under load, from ``specs[first]`` serving; the workers must be in the
    gateway before it."""
    steps = [("deploy", str(specs[(first + i + 1) % 2]), "--serial", "1") for i in range(opts.rollouts)]
    steps.append(("service", "restart", "--serial", "2"))
    meter, codes, timeline = OutMeter(url, expected), [], []
    start = time.monotonic()
    with streaming_load(url, clients=opts.clients, tokens=opts.tokens) as tally:
        meter.thread.start()
        for step in steps:
            code, seconds = fleetctl(inv, *step)
            codes.append(code)
            # the running counts at each step's end: which step lost what
            label = f"deploy {Path(step[1]).stem} --serial 1" if step[0] == "deploy" else " ".join(step)
            timeline.append({"step": label,
                             "exit": code, "seconds": round(seconds, 1), "at": round(time.monotonic() - start, 1),
                             "completed": tally.completed, "failed": len(tally.failed),
                             "truncated": len(tally.truncated)})
    meter.stop.set()
    distinct = Counter(tally.failed + tally.truncated)
    return {"completed": tally.completed, "failed": len(tally.failed), "truncated": len(tally.truncated),
            "seconds": round(time.monotonic() - start, 1), "max_out": meter.most, "exit_codes": codes,
            "steps": timeline, "distinct_failures": [{"count": n, "problem": p} for p, n in distinct.most_common()]}


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
             "| fleetctl | completed | failed | truncated | most workers out at once | total s | exit codes |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name, r in results.items():
        label = "with router_url (drain, re-add)" if name == "with" else "without (today's behaviour)"
        lines.append(f"| {label} | {r['completed']} | {r['failed']} | {r['truncated']} | {r['max_out']} | "
                     f"{r['seconds']} | {' '.join(map(str, r['exit_codes']))} |")
    text = "\n".join(lines) + "\n"
    Path(opts.out + ".md").write_text(text)
    Path(opts.out + ".json").write_text(json.dumps(results, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
