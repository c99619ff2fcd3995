"""How bench/scale.py measures one sample: wall time, the controller's CPU and peak RSS, checked.

A tool is a function that runs once and returns a Sample. Every command runs under GNU time
(/usr/bin/time), which reaps it with wait4 and reports its rusage: CPU of the command's whole tree
(its own and its reaped descendants'), and the peak RSS of the largest process in it. Not the
bench's own wait4: a child forked from this (large) Python process carries its RSS until exec,
and the kernel counts that in the child's peak. A fan-out of N `ssh` processes (the OpenSSH
lower bound) adds up each one's CPU and peak RSS (they all run at once). fleetctl's
kept-connection server is no child of the command: its CPU is read from /proc before and after,
and its peak RSS (VmHWM) is added to the command's.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from jobs import BenchError


@dataclass
class Sample:
    wall_s: float
    cpu_s: float  # controller: user + system, the whole process tree (+ the kept-connection server)
    rss_kb: int  # controller peak RSS (see the module doc)


Tool = Callable[[], Sample]
Check = Callable[[int, str], "str | None"]


TIME = "/usr/bin/time"


def _timed(argv: list[str], usage: Path) -> list[str]:
    return [TIME, "-q", "-f", "%U %S %M", "-o", str(usage), *argv]


def _reap(proc: subprocess.Popen[bytes], usage: Path) -> tuple[int, float, int]:
    """Wait for ``proc`` (GNU time running a command): (exit code, CPU seconds, peak RSS KiB)."""
    rc = proc.wait()
    try:
        user, system, peak = usage.read_text().split()[-3:]
    except (OSError, ValueError):
        raise BenchError(f"{TIME} left no usage in {usage} (exit {rc})") from None
    return rc, float(user) + float(system), int(peak)


def command(argv: list[str], check: Check, env: dict[str, str] | None = None,
            before: Callable[[], None] | None = None, with_stderr: bool = False,
            server: Callable[[], tuple[float, int]] | None = None) -> Tool:
    """One whole command; ``check(rc, output)`` says why a sample does not count (None: it does).
    ``server()``: (CPU seconds so far, peak RSS KiB) of a helper the command talks to."""

    def run() -> Sample:
        if before:
            before()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                tempfile.TemporaryDirectory() as scratch:
            usage = Path(scratch) / "usage"
            cpu0 = server()[0] if server else 0.0
            start = time.perf_counter()
            proc = subprocess.Popen(_timed(argv, usage), stdout=out, stderr=err, env=env)
            rc, cpu, rss = _reap(proc, usage)
            took = time.perf_counter() - start
            helper_cpu, helper_rss = server() if server else (0.0, 0)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        why = check(rc, stdout + "\n" + stderr if with_stderr else stdout)
        if why:
            hosts = host_failures(stdout)
            raise BenchError(f"{shlex.join(argv)[:300]}: {why}; " + (hosts or f"stderr: {stderr[-1500:]}; "
                                                                       f"stdout: {stdout[-800:]}"))
        return Sample(took, cpu + (helper_cpu - cpu0 if server else 0.0), rss + helper_rss)

    return run


def host_failures(stdout: str) -> str:
    """The hosts a fleetctl --json answer has not ok, grouped by reason (a host's address and
    name taken out, so alike reasons count together), with up to 5 hosts of each: "" when none."""
    import json
    import re
    from collections import defaultdict

    try:
        hosts = json.loads(stdout)["hosts"]
    except (ValueError, KeyError, TypeError):
        return ""
    rows = hosts.items() if isinstance(hosts, dict) else ((h.get("host"), h) for h in hosts)
    groups: dict[str, list[str]] = defaultdict(list)
    for name, row in rows:
        if isinstance(row, dict) and row.get("status") not in ("ok", None):
            reason = re.sub(r"\b\d+\.\d+\.\d+\.\d+\b", "ADDR", str(row.get("reason") or row.get("status")))
            groups[f"{row.get('status')}: {reason}"].append(str(name))
    return "; ".join(f"{len(names)} hosts {why} ({', '.join(names[:5])})"
                     for why, names in sorted(groups.items(), key=lambda kv: -len(kv[1])))


def fan_out(argvs: list[list[str]], script: Path, expect: Callable[[int, str], bool],
            before: Callable[[], None] | None = None) -> Tool:
    """One ``ssh HOST PYTHON -`` per host reading ``script``, all started at once, then reaped."""

    def run() -> Sample:
        if before:
            before()
        files = [script.open("rb") for _ in argvs]
        outs = [tempfile.TemporaryFile() for _ in argvs]
        scratch = tempfile.TemporaryDirectory()
        usages = [Path(scratch.name) / f"usage-{n}" for n in range(len(argvs))]
        try:
            start = time.perf_counter()
            procs = [subprocess.Popen(_timed(a, u), stdin=f, stdout=o, stderr=subprocess.STDOUT)
                     for a, u, f, o in zip(argvs, usages, files, outs, strict=True)]
            reaped = [_reap(p, u) for p, u in zip(procs, usages, strict=True)]
            took = time.perf_counter() - start
            for n, ((rc, _, _), out) in enumerate(zip(reaped, outs, strict=True), start=1):
                out.seek(0)
                text = out.read().decode(errors="replace").strip()
                if rc != 0 or not expect(n, text):
                    raise BenchError(f"{shlex.join(argvs[n - 1])[:200]}: rc {rc}, {text[-600:]!r}")
        finally:
            for f in (*files, *outs):
                f.close()
            scratch.cleanup()
        return Sample(took, sum(r[1] for r in reaped), sum(r[2] for r in reaped))

    return run


def server_meter(folder: Path) -> Callable[[], tuple[float, int]]:
    """(CPU seconds, VmHWM KiB) of the processes named in ``folder/*.pid`` (the kept-connection server)."""
    ticks = os.sysconf("SC_CLK_TCK")

    def read() -> tuple[float, int]:
        cpu, peak = 0.0, 0
        for pid_file in folder.glob("*.pid"):
            try:
                pid = int(pid_file.read_text())
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                status = Path(f"/proc/{pid}/status").read_text()
            except (OSError, ValueError):
                continue
            cpu += (int(fields[11]) + int(fields[12])) / ticks
            peak += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
        return cpu, peak

    return read


@dataclass
class Measured:
    wall_s: list[float]
    cpu_s: list[float]
    rss_kb: list[int]
    host_cpu_s: list[float]
    failed: str = ""  # why the tool stopped being measured (a failed sample is never a result)


def rounds(tools: dict[str, Tool], runs: int, host_cpu: Callable[[], float] | None,
           between: Callable[[], None] | None = None, warmup: int = 1) -> dict[str, Measured]:
    """Warm-up round(s) discarded, then ``runs`` rounds, each running every tool once in order;
    the hosts' CPU (``host_cpu()``: seconds so far) is read before and after each sample, once the
    hosts have gone quiet (the sessions of the sample before reaped)."""
    from jobs import settle

    got = {name: Measured([], [], [], []) for name in tools}
    for i in range(warmup + runs):
        for name, tool in tools.items():
            if got[name].failed:
                continue
            if host_cpu:
                settle(host_cpu)
            hosts0 = host_cpu() if host_cpu else 0.0
            try:
                sample = tool()
            except (BenchError, OSError) as exc:  # this tool is out at this size; the others go on
                got[name].failed = str(exc)[:2000]
                print(f"    {name} failed: {str(exc)[:300]}", flush=True)
                continue
            if i < warmup:
                continue
            if host_cpu:
                settle(host_cpu)
            m = got[name]
            m.wall_s.append(round(sample.wall_s, 4))
            m.cpu_s.append(round(sample.cpu_s, 4))
            m.rss_kb.append(sample.rss_kb)
            m.host_cpu_s.append(round(host_cpu() - hosts0, 4) if host_cpu else float("nan"))
        if between:
            between()
    return got
