"""Where a `models sync` round's time goes on the lab (``models_sync.py --profile``).

A sampler thread, every 0.25 s while a sync runs:
- CPU seconds of every process of each lab host (its mount namespace), by command name: the chain's
  node (python3), the ssh client that encrypts a link, the sshd that decrypts it;
- the bytes landed on each host (the model folder and its staging, part files included), so each
  hop's throughput and how far it trails the host before it can be read off.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def cpu_of(pid: int) -> tuple[str, float] | None:
    """(command name, user+system CPU seconds) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1:raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2:].split()
    return name, (int(fields[11]) + int(fields[12])) / TICK


def landed(folders: list[Path]) -> int:
    total = 0
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    continue
    return total


class Sampler:
    """Samples CPU per (host, command) and bytes landed per host until stopped."""

    def __init__(self, sshd_pids: dict[str, int], host_dirs: dict[str, list[Path]], every: float = 0.25) -> None:
        self.ns = {mount_ns(pid): host for host, pid in sshd_pids.items()}
        self.host_dirs, self.every = host_dirs, every
        self.cpu: dict[int, tuple[str, str, float]] = {}  # pid -> (host, command, last CPU seconds)
        self.timeline: list[tuple[float, dict[str, int]]] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def __enter__(self) -> Sampler:
        self.started = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join()

    def loop(self) -> None:
        while not self.stop_event.is_set():
            self.sample()
            self.stop_event.wait(self.every)
        self.sample()

    def sample(self) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            host = self.ns.get(mount_ns(int(entry)))
            if host is None:
                continue
            got = cpu_of(int(entry))
            if got is not None:
                self.cpu[int(entry)] = (host, got[0], got[1])
        now = time.monotonic() - self.started
        self.timeline.append((now, {h: landed(d) for h, d in self.host_dirs.items()}))

    def cpu_by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for host, name, seconds in self.cpu.values():
            kind = "node (python)" if name.startswith("python") else name
            out[kind] = out.get(kind, 0.0) + seconds
            out[f"{host} {kind}"] = out.get(f"{host} {kind}", 0.0) + seconds
        return out

    def hops(self, size: int) -> list[str]:
        """Per host: first byte, done, mean rate between, and the largest lag behind the host before it."""
        lines, order = [], list(self.host_dirs)
        for i, host in enumerate(order):
            first = next((t for t, got in self.timeline if got[host] > 0), None)
            done = next((t for t, got in self.timeline if got[host] >= size), None)
            lag = 0
            if i > 0:
                lag = max(got[order[i - 1]] - got[host] for _, got in self.timeline)
            rate = size / (done - first) / 1e6 if first is not None and done and done > first else 0.0
            lines.append(f"{host}: first byte {first or 0:.1f}s, landed {done or 0:.1f}s, {rate:.1f} MB/s, "
                         f"max lag behind the previous {lag / 1e6:.1f} MB")
        return lines

    def rates(self, window: float = 2.0) -> list[str]:
        """Per host, its landing rate in windows of ``window`` seconds (MB/s): stalls show as dips."""
        out = []
        for host in self.host_dirs:
            points, row, mark = self.timeline, [], 0.0
            last = (0.0, 0)
            for t, got in points:
                if t - mark >= window:
                    row.append((got[host] - last[1]) / (t - last[0]) / 1e6)
                    last, mark = (t, got[host]), t
            out.append(f"{host}: " + " ".join(f"{r:.0f}" for r in row))
        return out
