"""The fleet report's page for 200 hosts (issue 24): its size, the time to build and render it in
Python, and the time headless Chromium takes to load it, run its script and paint it (a screenshot),
less Chromium's own start (the same command on an empty page). Targets: under 2 s, under 2 MB.

The fleet is the synthetic one of tests/report_support.py (no host): 196 green hosts, one stale, one
red GPU host, one with its service stopped, one unreachable; one rollout journal.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import report_support as rs  # noqa: E402

from fleetctl import report  # noqa: E402

CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"]


def paint(url: str, shot: Path) -> float:
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        t0 = time.perf_counter()
        subprocess.run([*CHROMIUM, f"--user-data-dir={profile}", "--window-size=1280,2000",
                        f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True)
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="report-bench-"))
    t0 = time.perf_counter()
    doc = report.build(rs.fleet(work, n_green=196), now=rs.NOW)
    html = report.to_html(doc)
    python_s = time.perf_counter() - t0
    page, empty = work / "fleet.html", work / "empty.html"
    page.write_text(html)
    empty.write_text("<!DOCTYPE html><title>empty</title>")
    size = len(html.encode())
    print(f"hosts: {doc['summary']['hosts']}; page {size / 1e6:.2f} MB; build + render in Python {python_s:.2f} s")
    if shutil.which("chromium") is None:
        print("chromium not installed (make chromium): no browser timing")
        return 0 if size < 2e6 else 1
    runs = [(paint(page.as_uri(), work / "p.png"), paint(empty.as_uri(), work / "e.png")) for _ in range(3)]
    page_s = statistics.median(p - e for p, e in runs)
    print(f"chromium: load + script + paint {page_s:.2f} s beyond its own start "
          f"(whole command {statistics.median(p for p, _ in runs):.2f} s; empty page "
          f"{statistics.median(e for _, e in runs):.2f} s); screenshot {work / 'p.png'}")
    ok = size < 2e6 and page_s < 2.0
    print("targets (under 2 MB, under 2 s):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
