"""drift --verify-files over lab hosts whose venvs hold the real sglang 0.5.23 wheel's files:
first run (no hash cache on the hosts) vs second run (every file unchanged: nothing re-hashed).

Run: .venv/bin/python bench/drift.py [--hosts 4] [--runs 5]   (writes bench/drift.md)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from jobs import FLEETCTL, BenchError, compile_fleetctl  # noqa: E402
from lab_support import LabHandle  # noqa: E402
from sglang_support import NEW_SGLANG, install_layout  # noqa: E402

from fleetctl.lab import LabPaths, lab_down, lab_up  # noqa: E402
from fleetctl.transport.mux import socket_path, stop_server  # noqa: E402

LAB = ROOT / ".fleetctl" / "bench-drift-lab"
HOST_SECONDS: dict[str, list[float]] = {}  # per command: the slowest host's own file-check time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    opts = ap.parse_args()
    try:
        lab = LabHandle.from_fleet(lab_up(opts.hosts, LAB, "127.0.94.0"))
        install_layout(lab, {h: NEW_SGLANG for h in lab.hosts})
        compile_fleetctl()
        args = ["drift", "--venv", "/root/ml-env", "--verify-files", "--skip", "unsatisfied"]
        job = drift_job(lab.inventory_path, args, len(lab.hosts))
        versions = drift_job(lab.inventory_path, args[:3] + args[4:], len(lab.hosts))
        kept = drift_job(lab.inventory_path, args, len(lab.hosts), persist=LAB / "mux")
        kept()  # opens the kept connections (the warm-up ansible's ControlPersist also gets)
        first, second, plain, kept_first, kept_second = [], [], [], [], []
        for _ in range(opts.runs):  # alternate: cold, warm, version-only, kept cold, kept warm
            clear_caches(lab)
            first.append(job())
            second.append(job())
            plain.append(versions())
            clear_caches(lab)
            kept_first.append(kept())
            kept_second.append(kept())
        checks = HOST_SECONDS[" ".join(args)]
        first_name = "drift --verify-files, first run (cold hash cache)"
        kept_name = "drift --verify-files --persist, first run (cold hash cache)"
        check_name = "host-side file check alone, first run (slowest host)"
        report([(first_name, first, first_name),
                ("drift --verify-files, second run (nothing changed)", second, first_name),
                ("drift, versions only", plain, first_name),
                (kept_name, kept_first, kept_name),
                ("drift --verify-files --persist, second run (nothing changed)", kept_second, kept_name),
                (check_name, checks[0::2], check_name),
                ("host-side file check alone, second run (slowest host)", checks[1::2], check_name)],
               len(lab.hosts))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_server(socket_path(LAB / "mux"))
        lab_down(LAB, purge=True)
        shutil.rmtree(LAB, ignore_errors=True)
    return 0


def clear_caches(lab: LabHandle) -> None:
    """What makes the next run a first run: every host's hash cache removed (from this side)."""
    paths = LabPaths(lab.dir)
    for host in lab.hosts:
        shutil.rmtree(paths.host_dir(host) / "var-lib-fleetctl" / "cache", ignore_errors=True)


def drift_job(inventory: Path, args: list[str], hosts: int, persist: Path | None = None):  # type: ignore[no-untyped-def]
    """One whole ``fleetctl drift --json``: exit 0 (identical venvs, no drift) on every host.
    ``persist``: over kept connections (FLEETCTL_PERSIST), with the server's socket in that folder."""
    import json
    import os
    import subprocess

    argv = [str(FLEETCTL), "-i", str(inventory), *args, "--format", "json"]
    env = {**os.environ, "FLEETCTL_PERSIST": "300", "FLEETCTL_MUX_DIR": str(persist)} if persist else None

    def run() -> float:
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        took = time.perf_counter() - start
        doc = json.loads(proc.stdout or "{}")
        if proc.returncode != 0 or doc.get("summary", {}).get("hosts") != hosts:
            raise BenchError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-1000:]}")
        files = [h.get("files") or {} for h in doc["hosts"].values()]
        if not persist:
            HOST_SECONDS.setdefault(" ".join(args), []).append(max(f.get("seconds") or 0.0 for f in files))
        return took

    return run


def report(rows: list[tuple[str, list[float], str]], hosts: int) -> None:
    """Each row's ratio is against the row it names (its own first run)."""
    medians = {name: statistics.median(xs) for name, xs, _ in rows}
    lines = [f"# drift timings ({time.strftime('%Y-%m-%d')}, {hosts} lab hosts, sglang {NEW_SGLANG}: "
             "7,268 RECORD files per venv, whole commands)", "", "Command: `.venv/bin/python bench/drift.py`", "",
             "| job | runs | median s | min | max | first run / this |", "|---|---:|---:|---:|---:|---:|"]
    for name, xs, base in rows:
        med = statistics.median(xs)
        ratio = medians[base] / med
        lines.append(f"| {name} | {len(xs)} | {med:.2f} | {min(xs):.2f} | {max(xs):.2f} | {ratio:.1f}x |")
    text = "\n".join(lines) + "\n"
    (ROOT / "bench" / "drift.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
