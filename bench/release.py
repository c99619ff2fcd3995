"""Release timings on the lab fleet: deploy of the example DDTree release, and rollback per host
(switch ``current`` + restart the stand-in service + wait for /health), as whole commands.

Run: .venv/bin/python bench/release.py [--hosts 4] [--runs 5]   (writes bench/release.md)
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

from jobs import fleetctl_job  # noqa: E402
from lab_support import LabHandle  # noqa: E402
from sglang_support import LAYOUT, install_layout  # noqa: E402

from fleetctl.lab import lab_down, lab_up  # noqa: E402
from fleetctl.release.spec import load_spec  # noqa: E402

LAB = ROOT / ".fleetctl" / "bench-release-lab"
PLAIN = ROOT / "playbooks/releases/sglang-0.5.23-lab.yml"
DDTREE = ROOT / "playbooks/releases/ddtree-sglang-0.5.23-lab.yml"


def timed(job: object, runs: int) -> list[float]:
    return [job() for _ in range(runs)]  # type: ignore[operator]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--runs", type=int, default=5)
    opts = ap.parse_args()
    try:
        lab = LabHandle.from_fleet(lab_up(opts.hosts, LAB, "127.0.93.0"))
        install_layout(lab, {h: LAYOUT["lab1"] for h in lab.hosts})
        inv, n = lab.inventory_path, len(lab.hosts)
        deploy_plain = fleetctl_job(inv, ["-l", "all", "deploy", str(PLAIN)], n)()
        deploy_ddtree = fleetctl_job(inv, ["-l", "all", "deploy", str(DDTREE)], n)()
        ids = [load_spec(PLAIN).release_id, load_spec(DDTREE).release_id]
        samples = []
        for i in range(opts.runs):  # alternate: every sample is a real switch + restart + health
            samples.append(fleetctl_job(inv, ["-l", "all", "rollback", "--to", ids[i % 2]], n)())
        rows = [("deploy DDTree release (fresh build)", [deploy_ddtree]), ("deploy plain release", [deploy_plain]),
                (f"rollback of {n} hosts (switch + restart + /health)", samples)]
        report(rows, n)
    finally:
        lab_down(LAB, purge=True)
        shutil.rmtree(LAB, ignore_errors=True)
    return 0


def report(rows: list[tuple[str, list[float]]], hosts: int) -> None:
    lines = [f"# Release timings ({time.strftime('%Y-%m-%d')}, {hosts} lab hosts, whole commands)", "",
             "Command: `.venv/bin/python bench/release.py`", "",
             "| job | runs | median s | min | max |", "|---|---:|---:|---:|---:|"]
    for name, xs in rows:
        lines.append(f"| {name} | {len(xs)} | {statistics.median(xs):.2f} | {min(xs):.2f} | {max(xs):.2f} |")
    text = "\n".join(lines) + "\n"
    (ROOT / "bench" / "release.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
