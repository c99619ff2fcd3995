"""A cProfile of one whole fleetctl command, every thread included (issue 23).

cProfile alone sees only the main thread, and fleetctl's work happens in its host threads and
paramiko's transport threads: here every thread started gets a profiler of its own, and their
statistics are merged at exit. Worker processes (many hosts) are profiled when
FLEETCTL_PROFILE_WORKERS names a folder: each writes its own stats there, merged in too.

    .venv/bin/python bench/profile_cli.py [--sort tottime] [--top 40] -- -i INV -f 64 ping --json
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sort", default="tottime")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", help="also write the merged stats to this file")
    ap.add_argument("--wall", action="store_true", help="wall time per thread (default: each thread's CPU time, "
                    "so time spent waiting for the GIL, the network or the hosts is left out)")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    ns = ap.parse_args()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    timer = time.perf_counter if ns.wall else time.thread_time

    def per_thread(*_: object) -> None:
        prof = cProfile.Profile(timer)
        with lock:
            profiles.append(prof)
        prof.enable()

    workers = Path(tempfile.mkdtemp(prefix="fleetctl-profile-"))
    os.environ["FLEETCTL_PROFILE_WORKERS"] = str(workers)
    os.environ["FLEETCTL_PROFILE_WALL"] = "1" if ns.wall else ""
    threading.setprofile(per_thread)
    main_prof = cProfile.Profile(timer)
    profiles.append(main_prof)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    from fleetctl.cli.main import cli

    code = 0
    main_prof.enable()
    try:
        cli.main(args, prog_name="fleetctl", standalone_mode=False)
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        main_prof.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    stats = pstats.Stats(main_prof, stream=sys.stderr)
    for prof in profiles[1:]:
        try:
            prof.disable()
            stats.add(prof)
        except (TypeError, ValueError):  # a thread that never ran any Python
            pass
    for path in sorted(workers.glob("*.prof")):
        stats.add(str(path))
        path.unlink()
    workers.rmdir()
    print(f"profile: wall {wall:.2f}s, this process's CPU {cpu:.2f}s, {len(profiles)} threads profiled",
          file=sys.stderr)
    if ns.out:
        stats.dump_stats(ns.out)
    stats.sort_stats(ns.sort).print_stats(ns.top)
    return code


if __name__ == "__main__":
    sys.exit(main())
