"""`make bench`: fleetctl side by side with plain OpenSSH on a lab fleet of real sshd hosts.

Starts its own lab (.fleetctl/bench-lab on 127.0.90.x), times whole commands against the
OpenSSH lower bound and the agent against per-operation execs, writes bench/results.md and
bench/results.json, and takes the lab down again, also on error.

    .venv/bin/python bench/run.py [--hosts 8|8,32] [--runs 7] [--ops 20]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jobs  # noqa: E402
import report  # noqa: E402

from fleetctl.lab import lab_down, lab_up  # noqa: E402

LAB_DIR = HERE.parent / ".fleetctl" / "bench-lab"
BASE = "127.0.90.0"
# paramiko (fleetctl) and OpenSSH 9.2 agree on curve25519; OpenSSH alone defaults to sntrup761x25519.
SAME_KEX = ("-o", "KexAlgorithms=curve25519-sha256")


def host_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hosts wants N or N,M,...: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--hosts wants counts >= 1: {text!r}")
    return counts


def fleet_samples(count: int, runs: int) -> dict[str, dict[str, list[float]]]:
    """Bring the lab to `count` hosts, then alternate the commands for `runs` rounds."""
    fleet = lab_up(count, LAB_DIR, BASE)
    print(f"lab: {count} hosts up in {fleet.elapsed_s:.1f}s ({fleet.inventory_path})", flush=True)
    inv = fleet.inventory_path
    addrs = [h.address for h in fleet.hosts]
    node = f"/usr/bin/python3 -c {shlex.quote(jobs.PY_NODE)}"
    kernel = subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()

    def is_node(n: int, out: str) -> bool:
        return out == f"lab{n}"

    def is_kernel(n: int, out: str) -> bool:
        return out == kernel

    order = {
        ("ping", "fleetctl"): jobs.fleetctl_job(inv, ["ping"], count),
        ("ping", "openssh"): jobs.openssh_job(LAB_DIR, addrs, node, is_node),
        ("ping", "openssh-x25519"): jobs.openssh_job(LAB_DIR, addrs, node, is_node, SAME_KEX),
        ("shell", "fleetctl"): jobs.fleetctl_job(inv, ["shell", "uname -r"], count),
        ("shell", "openssh"): jobs.openssh_job(LAB_DIR, addrs, "uname -r", is_kernel),
        ("shell", "openssh-x25519"): jobs.openssh_job(LAB_DIR, addrs, "uname -r", is_kernel, SAME_KEX),
    }
    flat = jobs.rounds({f"{j}/{t}": fn for (j, t), fn in order.items()}, runs)
    out: dict[str, dict[str, list[float]]] = {}
    for (job, tool) in order:
        out.setdefault(job, {})[tool] = flat[f"{job}/{tool}"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=host_counts, default=[8], help="host count(s): 8 or 8,32 (default 8)")
    ap.add_argument("--runs", type=int, default=7, help="timed runs per command after 1 warm-up (>= 5)")
    ap.add_argument("--ops", type=int, default=20, help="operations per batch in the agent claim")
    args = ap.parse_args(argv)
    if args.runs < 5:
        ap.error("--runs must be at least 5")
    given = sys.argv[1:] if argv is None else argv
    command = ".venv/bin/python bench/run.py " + shlex.join(given) if given else "make bench"
    doc: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": report.machine(), "command": command,
        "runs": args.runs, "warmup": 1, "load_before": os.getloadavg()[0], "fleet": {},
    }
    started = time.monotonic()
    try:
        for count in sorted(set(args.hosts)):
            doc["fleet"][str(count)] = fleet_samples(count, args.runs)
        print(f"agent claim: {args.ops} ops x {args.runs} runs on lab1", flush=True)
        doc["agent"] = {
            "ops": args.ops, "exec": f"/usr/bin/python3 -c '{jobs.PY_NODE}'",
            "samples": jobs.agent_claim(LAB_DIR / "inventory.yml", args.ops, args.runs),
        }
    finally:
        lab_down(LAB_DIR, purge=True)
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    doc["load_after"] = os.getloadavg()[0]
    print(report.write(doc))
    print(f"(took {doc['elapsed_s']}s; wrote {HERE / 'results.md'} and {HERE / 'results.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
