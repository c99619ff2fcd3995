"""Fan-out over worker processes, so a run over many hosts is not bound to one core.

Every fresh SSH connection costs the controller Python work (paramiko's packet layer, its
transport thread, the agent protocol), and in one process all of it shares one GIL: past a few
dozen hosts, one core bounds the run. ``spread_map`` forks workers that each hold a contiguous
share of the hosts (their connections and agents, a thread pool of their own) and send every
host's ``HostResult`` back over a pipe as it completes; the caller receives them in host order.

What stays as in one process: per-host results (a host's failure is its own result; a worker
that dies makes its unanswered hosts failed, naming why), the connect and command timeouts (the
same code runs in the worker), host keys (the same checks), bounded output. Ctrl-C reaches the
workers (the terminal signals the whole group; a SIGINT sent to the controller alone is passed
on): each stops, closes its connections (the agents exit at EOF) and exits; the controller waits
for them, then raises ``KeyboardInterrupt`` as before. A worker's connections end with its share:
a later ``map`` on the same fleet connects again, in the controller's own threads.

Used only where the fleet says so (``RunSettings.workers``: read-only commands on fresh
connections) and with a fork start (Linux); FLEETCTL_WORKERS=N overrides the count (1: none).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Protocol, TypeVar

from fleetctl.transport import fdwait
from fleetctl.transport.base import Connector, HostResult, Status


class SpreadHost(Protocol):
    """What a worker needs of a host's session (``fleet.HostContext`` has it; named here so the fleet
    imports this module and not the other way round)."""

    name: str
    unreachable: str | None
    connector: Connector


T = TypeVar("T")
C = TypeVar("C", bound=SpreadHost)
HOSTS_PER_WORKER = 24  # below this a worker's start (a fork, its share of imports) costs more than it saves
_HEADER = struct.Struct(">iI")  # host index (-1: the worker is done), pickle length


def worker_count(hosts: int, wanted: int) -> int:
    """How many worker processes for ``hosts`` hosts: ``wanted`` (0: one per core, at most one per
    HOSTS_PER_WORKER hosts), or FLEETCTL_WORKERS; 1 means none (the fan-out stays in this process)."""
    env = os.environ.get("FLEETCTL_WORKERS", "").strip()
    if not hasattr(os, "fork"):
        return 1
    if env.isdigit():
        count = int(env)
    elif wanted > 0:
        count = wanted
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        count = min(cores, hosts // HOSTS_PER_WORKER)
    return max(1, min(count, hosts))


def shares(count: int, workers: int) -> list[range]:
    """``count`` indexes cut into ``workers`` contiguous runs, the first ones a host longer."""
    base, extra = divmod(count, workers)
    out, start = [], 0
    for i in range(workers):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return [r for r in out if len(r)]


def spread_map(contexts: Sequence[C], fn: Callable[[C], T], forks: int, workers: int,
               one: Callable[[C, Callable[[C], T]], HostResult[T]],
               close: Callable[[C], None]) -> Iterator[HostResult[T]]:
    """``one(ctx, fn)`` for every context, in ``workers`` processes; results in ``contexts`` order."""
    parts = shares(len(contexts), workers)
    threads = max(1, -(-forks // len(parts)))
    children: dict[int, tuple[int, range]] = {}  # read fd -> (pid, share)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        for part in parts:
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker: never returns
                os.close(read_fd)
                _worker([contexts[i] for i in part], part.start, fn, threads, one, close, write_fd)
            os.close(write_fd)
            children[read_fd] = (pid, part)
        yield from _collect(contexts, children)
    except KeyboardInterrupt:
        for pid, _part in children.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)  # a no-op for a worker the terminal already told
        raise
    finally:
        for read_fd, (pid, _part) in children.items():
            with contextlib.suppress(OSError):
                os.close(read_fd)
            _reap(pid)


def _reap(pid: int) -> None:
    while True:
        try:
            os.waitpid(pid, 0)
            return
        except ChildProcessError:
            return
        except KeyboardInterrupt:  # a second Ctrl-C while the workers close: end them now
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _collect(contexts: Sequence[C], children: dict[int, tuple[int, range]]) -> Iterator[HostResult[Any]]:
    results: list[HostResult[Any] | None] = [None] * len(contexts)
    buffers = {fd: bytearray() for fd in children}
    next_out = 0
    open_fds = set(children)
    while open_fds:
        ready = fdwait.readable(open_fds, None)
        for fd in ready:
            data = os.read(fd, 1 << 16)
            if not data:
                open_fds.discard(fd)
                _fill_missing(contexts, results, children[fd][1], "worker process ended before it answered")
                continue
            buffers[fd] += data
            for index, result in _frames(buffers[fd]):
                if index < 0:  # the worker's last word: its hosts are all answered
                    continue
                results[index] = result
        while next_out < len(results) and results[next_out] is not None:
            result = results[next_out]
            assert result is not None
            if result.status is Status.UNREACHABLE:
                contexts[next_out].unreachable = result.reason  # skipped for the rest of the run
            yield result
            next_out += 1


def _frames(buf: bytearray) -> Iterator[tuple[int, Any]]:
    while len(buf) >= _HEADER.size:
        index, size = _HEADER.unpack_from(buf)
        if len(buf) < _HEADER.size + size:
            return
        body = bytes(buf[_HEADER.size:_HEADER.size + size])
        del buf[:_HEADER.size + size]
        yield index, pickle.loads(body) if size else None


def _fill_missing(contexts: Sequence[C], results: list[HostResult[Any] | None], part: range,
                  why: str) -> None:
    for i in part:
        if results[i] is None:
            results[i] = HostResult(contexts[i].name, Status.FAILED, reason=f"internal error: {why}")


def _worker(share: list[C], first: int, fn: Callable[[C], T], threads: int,
            one: Callable[[C, Callable[[C], T]], HostResult[T]],
            close: Callable[[C], None], write_fd: int) -> None:
    code = 0
    profile = _start_profile()
    try:
        with ThreadPoolExecutor(max_workers=min(threads, len(share)), thread_name_prefix="fleetctl-host") as pool:
            futures = {pool.submit(one, ctx, fn): first + i for i, ctx in enumerate(share)}
            try:
                for future in as_completed(futures):
                    _send(write_fd, futures[future], future.result(), share[futures[future] - first].name)
            except KeyboardInterrupt:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # closing must not be cut short by a second one
                code = 130
                for ctx in share:  # the connections go first: work in flight ends with them, not at its timeout
                    with contextlib.suppress(Exception):
                        ctx.connector.close()
        if not code:
            _send(write_fd, -1, None, "")
    except BaseException:  # noqa: BLE001 - a worker must never run the controller's code after the fork
        code = 70
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with ThreadPoolExecutor(max_workers=min(threads, len(share)), thread_name_prefix="fleetctl-close") as pool:
            list(pool.map(close, share))
        _stop_profile(profile)
        with contextlib.suppress(OSError):
            os.close(write_fd)
        os._exit(code)  # no atexit handlers, no flushing of the controller's buffers a second time


def _send(fd: int, index: int, result: HostResult[Any] | None, host: str) -> None:
    try:
        body = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL) if result is not None else b""
    except Exception as exc:  # a value that cannot cross processes is that host's failure, not the run's
        body = pickle.dumps(HostResult(host, Status.FAILED, reason=f"internal error: result not transferable: {exc}"))
    data = _HEADER.pack(index, len(body)) + body
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _start_profile() -> Any:
    """FLEETCTL_PROFILE_WORKERS=DIR (bench/profile_cli.py): every thread of this worker profiled."""
    folder = os.environ.get("FLEETCTL_PROFILE_WORKERS")
    if not folder:
        return None
    import cProfile
    import threading
    import time

    timer = time.perf_counter if os.environ.get("FLEETCTL_PROFILE_WALL") else time.thread_time
    profiles: list[Any] = []

    def per_thread(*_: object) -> None:
        prof = cProfile.Profile(timer)
        profiles.append(prof)
        prof.enable()

    threading.setprofile(per_thread)
    return folder, profiles


def _stop_profile(state: Any) -> None:
    if state is None:
        return
    import pstats

    folder, profiles = state
    stats = None
    for prof in profiles:
        with contextlib.suppress(TypeError, ValueError):
            prof.disable()
            stats = pstats.Stats(prof) if stats is None else stats.add(prof) or stats
    if stats is not None:
        stats.dump_stats(os.path.join(folder, f"worker-{os.getpid()}.prof"))
