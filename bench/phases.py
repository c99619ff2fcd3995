"""Where one fleetctl command's wall time goes: per-phase timings of the controller, in-process.

Runs what `fleetctl ping`, `fleetctl drift --venv V` (versions only) and `fleetctl probe grep`
run (the same core functions), with the transport's steps wrapped in timers (nothing in
fleetctl is changed): Python start-up and imports, inventory, per host the SSH connect
(TCP + key exchange + auth), the agent start (exec channel, interpreter start, hello, ping) and
each agent call, then the agents' shutdown and the controller's own work on the answers.

    .venv/bin/python bench/phases.py INVENTORY [ping|inventory|search] [--runs 3]

Prints, per run: each phase's wall time, and per host phase the median and slowest host. Host
phases nest as they run: the first call on a host includes the agent's start, which includes
the SSH connect.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

T0 = time.perf_counter()

import fleetctl.transport.agent as agent_mod  # noqa: E402
import fleetctl.transport.ssh as ssh_mod  # noqa: E402
from fleetctl.inventory import load_inventory  # noqa: E402
from fleetctl.transport.fleet import Fleet, RunSettings  # noqa: E402

IMPORTED = time.perf_counter()
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import TERMS, VENV  # noqa: E402

SPANS: dict[str, list[float]] = defaultdict(list)
_lock = threading.Lock()


def timed(cls: Any, name: str, label: str | None = None) -> None:
    """Wrap cls.name so each call's wall time lands in SPANS[label] (per host thread)."""
    inner = getattr(cls, name)

    def wrapper(self: Any, *a: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(self, *a, **kw)
        finally:
            key = label or name
            if name == "call" and a:
                key = f"call {a[0]}"
            with _lock:
                SPANS[key].append(time.perf_counter() - start)

    setattr(cls, name, wrapper)


def fabric_import() -> None:
    start = time.perf_counter()
    import fabric  # noqa: F401  (the lazy import the first host thread pays, the others wait on)

    SPANS["import fabric (first host)"].append(time.perf_counter() - start)


def one(inventory_path: str, job: str) -> dict[str, float]:
    phases: dict[str, float] = {}
    t = time.perf_counter()
    inv = load_inventory(inventory_path)
    hosts = inv.select(None)
    phases["inventory"] = time.perf_counter() - t
    t = time.perf_counter()
    fleet = Fleet(inv, hosts, RunSettings(forks=32))
    with fleet:
        if job == "ping":
            from fleetctl import adhoc

            results: Any = adhoc.ping(fleet)
        elif job == "inventory":
            from fleetctl.drift import audit as core

            results = fleet.map(lambda ctx: core.collect(ctx, VENV, False))
        else:
            from fleetctl.probes.search import GrepRequest, grep_host

            req = GrepRequest(TERMS, package="sglang", subpath="srt", venv=VENV)
            results = fleet.map(lambda ctx: grep_host(ctx, req))
        phases["fan-out (connect, agents, work)"] = time.perf_counter() - t
        t = time.perf_counter()
    phases["shutdown (agents exit, connections close)"] = time.perf_counter() - t
    if job == "inventory":
        from fleetctl.drift import audit as core

        t = time.perf_counter()
        core.audit(results, skip=("unsatisfied",))
        phases["audit (drift's findings)"] = time.perf_counter() - t
    bad = [h for h, r in results.items() if not r.ok]
    if bad:
        raise SystemExit(f"hosts failed: {bad}: {results[bad[0]].reason}")
    return phases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inventory")
    ap.add_argument("job", choices=["ping", "inventory", "search"], nargs="?", default="ping")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    timed(ssh_mod.SSHConnector, "_open", "ssh connect (TCP, kex, auth)")
    timed(agent_mod.AgentClient, "_start", "agent start (exec, interpreter, hello, ping)")
    timed(agent_mod.AgentClient, "call")
    timed(agent_mod.AgentClient, "close", "agent exit request + channel close")
    print(f"python start-up + imports (fleetctl core, no click/rich): {IMPORTED - T0:.3f}s before main")
    fabric_import()
    for run in range(args.runs):
        SPANS_BEFORE = {k: len(v) for k, v in SPANS.items()}
        phases = one(args.inventory, args.job)
        print(f"run {run}: " + "; ".join(f"{k} {v:.3f}s" for k, v in phases.items()))
        for key, values in SPANS.items():
            new = values[SPANS_BEFORE.get(key, 0):]
            if new:
                print(f"    {key}: {len(new)} x, median {statistics.median(new):.3f}s, slowest {max(new):.3f}s, "
                      f"sum {sum(new):.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
