"""What the benchmark times: whole fleetctl commands, plain OpenSSH fan-outs, the agent claim.

Every sample is checked (exit status and output) before it counts: a fast failure is not a result.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLEETCTL = ROOT / ".venv" / "bin" / "fleetctl"


class BenchError(RuntimeError):
    """A measured command did not do its job."""


def fleetctl_job(inventory: Path, args: list[str], hosts: int, persist: Path | None = None) -> Callable[[], float]:
    """One whole `fleetctl -i INV ... --json` process; every host must be ok. ``persist``: over kept
    connections (FLEETCTL_PERSIST), the server's socket in that folder (its CPU is the client's)."""
    argv = [str(FLEETCTL), "-i", str(inventory), *args, "--json"]
    env = {**os.environ, "FLEETCTL_PERSIST": "300", "FLEETCTL_MUX_DIR": str(persist)} if persist else None

    def run() -> float:
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        took = time.perf_counter() - start
        if proc.returncode != 0:
            raise BenchError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr[-2000:]}")
        ok = json.loads(proc.stdout)["summary"]["ok"]
        if ok != hosts:
            raise BenchError(f"{shlex.join(argv)}: {ok} of {hosts} hosts ok")
        return took

    if persist:
        run.helper_cpu = pid_files_cpu(persist)  # type: ignore[attr-defined]
    return run


def persist_options(masters: Path) -> tuple[str, ...]:
    """OpenSSH's own kept connections: a ControlPersist master per host, sockets in ``masters``."""
    masters.mkdir(mode=0o700, parents=True, exist_ok=True)
    return ("-o", "ControlMaster=auto", "-o", f"ControlPath={masters}/cm-%C", "-o", "ControlPersist=300")


def stop_masters(masters: Path) -> None:
    for master in masters.glob("cm-*"):
        subprocess.run(["ssh", "-o", f"ControlPath={master}", "-O", "exit", "x"], capture_output=True)


def ssh_argv(lab_dir: Path, address: str, remote: str, extra: tuple[str, ...] = ()) -> list[str]:
    """Plain OpenSSH with the lab's key and pinned host keys (checking stays on)."""
    return [
        "ssh", "-F", "/dev/null", *extra, "-i", str(lab_dir / "id_ed25519"),
        "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={lab_dir / 'known_hosts'}",
        "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", f"root@{address}", remote,
    ]


def openssh_job(
    lab_dir: Path, addresses: list[str], remote: str, expect: Callable[[int, str], bool], extra: tuple[str, ...] = (),
) -> Callable[[], float]:
    """The lower bound: one `ssh HOST CMD` per host, all started at once, then all waited for."""
    argvs = [ssh_argv(lab_dir, a, remote, extra) for a in addresses]

    def run() -> float:
        start = time.perf_counter()
        procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for a in argvs]
        outs = [p.communicate() for p in procs]
        took = time.perf_counter() - start
        for n, (proc, (out, err)) in enumerate(zip(procs, outs, strict=True), start=1):
            if proc.returncode != 0 or not expect(n, out.strip()):
                raise BenchError(f"ssh {addresses[n - 1]} {remote!r}: rc {proc.returncode}, {out!r} {err!r}")
        return took

    return run


def checked_job(argv: list[str], check: Callable[[int, str], str | None], env: dict[str, str] | None = None,
                before: Callable[[], None] | None = None, with_stderr: bool = False) -> Callable[[], float]:
    """One whole command (a peer's CLI, or fleetctl); ``check(rc, stdout)`` returns why the sample
    does not count, or None (``with_stderr``: stdout and stderr, for tools that print answers on
    stderr). ``before`` runs untimed ahead of each sample (e.g. clearing caches)."""

    def run() -> float:
        if before:
            before()
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        took = time.perf_counter() - start
        why = check(proc.returncode, proc.stdout + "\n" + proc.stderr if with_stderr else proc.stdout)
        if why:
            raise BenchError(f"{shlex.join(argv)[:300]}: {why}; stderr: {proc.stderr[-1500:]}"
                             f"; stdout: {proc.stdout[-800:]}")
        return took

    return run


def openssh_script_job(
    lab_dir: Path, addresses: list[str], python: str, script: Path, expect: Callable[[int, str], bool],
    extra: tuple[str, ...] = (), before: Callable[[], None] | None = None,
) -> Callable[[], float]:
    """The lower bound for a script: one `ssh HOST PYTHON - < SCRIPT` per host, all started at once.
    ``before`` runs untimed ahead of each sample (e.g. clearing caches)."""
    argvs = [ssh_argv(lab_dir, a, f"{shlex.quote(python)} -", extra) for a in addresses]

    def run() -> float:
        if before:
            before()
        files = [script.open("rb") for _ in argvs]
        try:
            start = time.perf_counter()
            procs = [subprocess.Popen(a, stdin=f, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                     for a, f in zip(argvs, files, strict=True)]
            outs = [p.communicate() for p in procs]
            took = time.perf_counter() - start
        finally:
            for f in files:
                f.close()
        for n, (proc, (out, err)) in enumerate(zip(procs, outs, strict=True), start=1):
            text = out.decode(errors="replace").strip()
            if proc.returncode != 0 or not expect(n, text):
                raise BenchError(f"ssh {addresses[n - 1]} {python} - < {script.name}: rc {proc.returncode}, "
                                 f"{text[-500:]!r} {err[-1000:]!r}")
        return took

    return run


def rounds(jobs: dict[str, Callable[[], float]], runs: int, warmup: int = 1,
           cpu: dict[str, list[float]] | None = None, host_cpu: Callable[[], float] | None = None,
           hosts: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Warm-up round(s) discarded, then `runs` rounds, each running every job once in order.

    ``cpu`` gets, per job, the CPU seconds (user + system) its client processes used: the
    command and everything it started on this side. ``hosts`` gets what ``host_cpu()`` (CPU
    seconds used so far by the lab hosts' processes) grew by during the job.
    """
    samples: dict[str, list[float]] = {name: [] for name in jobs}
    for i in range(warmup + runs):
        for name, job in jobs.items():
            if host_cpu:
                settle(host_cpu)
            # CPU of helpers the command left running (fleetctl's kept-connection server): not a child
            helper = getattr(job, "helper_cpu", None)
            helper_before = helper() if helper else 0.0
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            on_hosts = host_cpu() if host_cpu else 0.0
            took = job()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            helper_used = helper() - helper_before if helper else 0.0
            if host_cpu and hosts is not None and i >= warmup:
                time.sleep(0.05)  # let the hosts' sshd reap the sessions that just ended
                hosts.setdefault(name, []).append(round(host_cpu() - on_hosts, 3))
            if i >= warmup:
                samples[name].append(took)
                if cpu is not None:
                    used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime + helper_used
                    cpu.setdefault(name, []).append(round(used, 4))
    return samples


def settle(host_cpu: Callable[[], float], quiet_s: float = 0.1, busy_below: float = 0.02,
           limit_s: float = 5.0) -> None:
    """Wait (up to ``limit_s``) until the lab hosts use under ``busy_below`` of a CPU over
    ``quiet_s``: the sessions of the command before (200 sshd ending, their processes reaped) have
    finished, so they do not land on whichever tool's sample comes next."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = host_cpu()
        time.sleep(quiet_s)
        if host_cpu() - before < busy_below * quiet_s:
            return


def pid_files_cpu(folder: Path) -> Callable[[], float]:
    """CPU seconds used so far by the processes named in ``folder/*.pid`` (user + system)."""
    ticks = os.sysconf("SC_CLK_TCK")

    def used() -> float:
        total = 0.0
        for pid_file in folder.glob("*.pid"):
            try:
                fields = Path(f"/proc/{int(pid_file.read_text())}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, ValueError):
                continue
            total += (int(fields[11]) + int(fields[12])) / ticks
        return total

    return used


def compile_fleetctl() -> None:
    """Byte-compile fleetctl first, as an install does: with PYTHONDONTWRITEBYTECODE set (this
    machine's default) a module edited since the install would be compiled again on every run."""
    import sys

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(__file__).resolve().parent.parent / "fleetctl")],
                   check=True, stdout=subprocess.DEVNULL)
