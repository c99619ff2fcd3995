"""Kept connections before and after a change, in the same rounds: the fleetctl-persist jobs of
bench/run.py (ping, facts, version inventory, source search) over one lab, each command run by this
checkout and by an older copy of the package (``--before DIR``: a folder holding ``fleetctl/``,
e.g. ``git archive REV fleetctl | tar -x -C DIR``), alternating within each round. Each has its own
kept-connection server (the socket name holds the server code's digest); both open their
connections in the warm-up round.

    .venv/bin/python bench/kept_batch.py --hosts 32 --runs 5 --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import jobs  # noqa: E402
import run  # noqa: E402

from fleetctl.lab import lab_up  # noqa: E402


def commands(lab: run.Lab) -> dict[str, tuple[list[str], str]]:
    """Each job's fleetctl arguments and the JSON summary key that must count every host."""
    return {
        "ping": (["ping"], "ok"),
        "facts": (["facts", "--venv", run.VENV], "ok"),
        "version inventory": (["drift", "--venv", run.VENV, "--skip", "unsatisfied"], "hosts"),
        "source search": (["probe", "grep", *run.TERMS, "--package", "sglang", "--subpath", "srt",
                           "--venv", run.VENV], "ok"),
    }


def job(lab: run.Lab, args: list[str], key: str, before: Path | None) -> Callable[[], float]:
    argv = [str(jobs.FLEETCTL), "-i", str(lab.inv), "-f", str(max(lab.count, 32)), *args, "--json"]
    servers = lab.mux_dir / ("before" if before else "after")  # apart: each server's CPU is its command's
    env = {**os.environ, "FLEETCTL_MUX_DIR": str(servers), "FLEETCTL_PERSIST": "300"}
    if before is not None:
        env["PYTHONPATH"] = str(before)  # the older package first on the path (the server inherits it)
    ok = run.json_summary(key, lab.count, rc_ok=(0, 1))  # drift exits 1 when it finds drift
    timed = jobs.checked_job(argv, ok, env=env)
    timed.helper_cpu = jobs.pid_files_cpu(servers)  # type: ignore[attr-defined]
    return timed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--before", type=Path, required=True, help="a folder holding the older fleetctl/ package")
    ap.add_argument("--out", type=Path, help="write the samples here as JSON")
    args = ap.parse_args(argv)
    jobs.compile_fleetctl()
    fleet = lab_up(args.hosts, run.LAB_DIR, run.BASE)
    run.install_venvs(fleet)
    lab = run.Lab.__new__(run.Lab)  # only what the fleetctl jobs need: no peers set up
    lab.fleet, lab.count, lab.inv, lab.mux_dir = fleet, len(fleet.hosts), fleet.inventory_path, fleet.directory / "mux"
    meter, _group = run.host_cpu_meter(fleet)
    doc: dict = {"hosts": lab.count, "runs": args.runs, "load_before": os.getloadavg(), "jobs": {}}
    try:
        for name, (cli, key) in commands(lab).items():
            tools = {"before": job(lab, cli, key, args.before), "after": job(lab, cli, key, None)}
            cpu: dict[str, list[float]] = {}
            on_hosts: dict[str, list[float]] = {}
            samples = jobs.rounds(tools, args.runs, cpu=cpu, host_cpu=meter, hosts=on_hosts)
            doc["jobs"][name] = {"wall_s": samples, "controller_cpu_s": cpu, "hosts_cpu_s": on_hosts,
                                 "load": os.getloadavg()}
            print(f"{name}: " + "; ".join(
                f"{k} wall {statistics.median(v):.3f}s, controller CPU {statistics.median(cpu[k]):.3f}s"
                + (f", hosts CPU {statistics.median(on_hosts[k]):.3f}s" if on_hosts.get(k) else "")
                for k, v in samples.items()), flush=True)
    finally:
        from fleetctl.transport import mux

        for server in lab.mux_dir.glob("*/*.sock"):  # this checkout's server and the older one's
            mux.stop_server(server)
    doc["load_after"] = os.getloadavg()
    doc["date"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
