"""Every read-only command's requests over kept connections, batched across the fleet.

A command's per-host work (``Fleet.map(fn)``) used to open one socket session per kept host, in a
thread of its own: attach, then each request, then detach, one message pair at a time. Here the
host functions still run as written (the same code decides what to ask each host, so the answers
are the fresh path's), but a request they make does not go out alone: it waits until every host
function of the pass is either waiting on a request of its own or done, and then all of them go
to the server as one ``call_many`` frame on one socket. The server fans the frame out over its own
pool, as ``ping_many`` does, and streams one answer per host back in the frame's order. A command
whose hosts make R requests in turn (facts: ``facts``, then ``venv_packages``) sends R frames,
whatever the number of hosts.

Per host, the server keeps what ``attach`` gives one host's session: the first request of the
command checks the kept connection (a dead one is replaced before it), later ones never retry;
every module's top level runs afresh once per command; the same error classes come back.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from fleetctl.errors import AgentError, ConnectError, FleetError
from fleetctl.transport import mux, mux_server
from fleetctl.transport.agent import AgentInfo
from fleetctl.transport.mux_answers import FrameReader, FrameSender, shareable

if TYPE_CHECKING:
    import socket

    from fleetctl.transport.base import HostResult

T = TypeVar("T")


class HostContext(Protocol):
    """What a pass needs of a host's context (``transport.fleet.HostContext``, which uses this module)."""

    agent: Any


class Fleet(Protocol):
    """What a pass needs of the fleet (``transport.fleet.Fleet``, which uses this module)."""

    contexts: Any
    settings: Any
    kept_frames: int

    def map_threads(self, fn: Callable[[Any], T], names: list[str]) -> dict[str, HostResult[T]]: ...

    def run_one(self, ctx: Any, fn: Callable[[Any], T]) -> HostResult[T]: ...

CLIENT_THREADS = 512  # host functions alive at once: each only waits for its turn in a frame
SERVER_THREADS = 64  # as mux_batch: round trips overlap, the GIL bounds the rest
STALL_S = 5.0  # a request waits at most this long for host functions that neither ask nor finish


# -- client --------------------------------------------------------------------------------------
def map_kept(fleet: Fleet, fn: Callable[[Any], T], names: list[str]) -> dict[str, HostResult[T]]:
    """``fn`` on every host of ``names``; the kept hosts' requests batched (module doc)."""
    kept = [n for n in names if isinstance(fleet.contexts[n].agent, mux.MuxAgentClient)]
    results: dict[str, HostResult[T]] = {}
    kept_set = set(kept)
    others = [n for n in names if n not in kept_set]
    if others:
        results.update(fleet.map_threads(fn, others))
    if kept:
        rounds = KeptRounds(fleet.settings.persist, fleet.settings.forks, workers=min(len(kept), CLIENT_THREADS),
                            total=len(kept))
        try:
            with ThreadPoolExecutor(max_workers=rounds.workers, thread_name_prefix="fleetctl-kept") as pool:
                done = list(pool.map(lambda n: rounds.run(fleet, fleet.contexts[n], fn), kept))
        finally:
            rounds.close()
            fleet.kept_frames += rounds.frames
        results.update(zip(kept, done, strict=True))
    return {n: results[n] for n in names}


@dataclass
class _Slot:
    """One host's request in the next frame, and its answer once the frame is back."""

    agent: mux.MuxAgentClient
    msg: dict[str, Any]
    answer: dict[str, Any] | None = None


@dataclass
class KeptRounds:
    """The frames of one pass: who is running, who waits, and the one socket to the server."""

    persist: float
    forks: int
    workers: int
    total: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    waiting: dict[str, _Slot] = field(default_factory=dict)
    running: int = 0
    started: int = 0
    sock: socket.socket | None = None
    broken: str | None = None  # the server failed: every later request of this pass fails alike
    frames: int = 0
    flushing: bool = False
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)  # each host's target, as sent

    def run(self, fleet: Fleet, ctx: HostContext, fn: Callable[[Any], T]) -> HostResult[T]:
        agent = ctx.agent
        assert isinstance(agent, mux.MuxAgentClient)
        with self.cond:
            self.running += 1
            self.started += 1
        agent.batch = self
        try:
            return fleet.run_one(ctx, fn)
        finally:
            agent.batch = None
            with self.cond:
                self.running -= 1
                self._flush_if_all_wait()

    def ask(self, agent: mux.MuxAgentClient, msg: dict[str, Any]) -> dict[str, Any]:
        """``msg`` for ``agent``'s host, answered when its frame comes back."""
        slot = _Slot(agent, msg)
        with self.cond:
            self.waiting[agent.host] = slot
            self._flush_if_all_wait()
            while slot.answer is None:
                if not self.cond.wait(STALL_S) and slot.answer is None and not self.flushing:
                    # A host function that waits on something else (a lock another host's function
                    # holds while it waits here) would wait forever: what waits goes now.
                    self._flush()
        return slot.answer

    def _all_wait(self) -> bool:
        """No host function could still add a request to the frame: every running one waits, and no
        host is left to start or every worker is taken."""
        if not self.waiting or len(self.waiting) < self.running:
            return False
        return self.started >= self.total or self.running >= self.workers

    def _flush_if_all_wait(self) -> None:
        if not self.flushing and self._all_wait():
            self._flush()

    def _flush(self) -> None:
        """Send what waits as one frame (lock held), and again while all wait once it is back."""
        while self.waiting:
            batch, self.waiting = list(self.waiting.values()), {}
            self.flushing = True  # one frame at a time on the socket
            self.cond.release()  # the frame's round trips happen with the others free to finish
            try:
                answers = self._exchange(batch)
            finally:
                self.cond.acquire()
                self.flushing = False
            for slot, answer in zip(batch, answers, strict=True):
                slot.answer = answer
            self.cond.notify_all()
            if not self._all_wait():
                return

    def _exchange(self, batch: list[_Slot]) -> list[dict[str, Any]]:
        sources: dict[str, str] = {}  # a module's text once per frame, not once per host
        hosts = [{"host": s.agent.host, "target": self._target(s.agent),
                  "interpreters": s.agent.interpreters, "request": _sources_out(s.msg, sources)} for s in batch]
        answers: list[dict[str, Any]] = []
        try:
            if self.broken is None:
                if self.sock is None:
                    self.sock = mux.connect(batch[0].agent.path, self.persist)
                mux.send_frame(self.sock, {"op": "call_many", "hosts": hosts, "sources": sources,
                                           "persist": self.persist, "forks": self.forks})
                self.frames += 1
                reader = FrameReader(self.sock)
                while len(answers) < len(batch):
                    answers.append(reader.read(len(answers)))
        except Exception as exc:  # never raised here: every host waiting on this frame must get an answer
            self.broken = mux.server_failed(batch[0].agent.path, exc)
        failed = {"ok": False, "error": {"class": "AgentError", "reason": self.broken}}
        return answers + [failed] * (len(batch) - len(answers))

    def _target(self, agent: mux.MuxAgentClient) -> dict[str, Any]:
        doc = self.targets.get(agent.host)
        if doc is None:
            doc = self.targets[agent.host] = mux.target_doc(agent.target)
        return doc

    def close(self) -> None:
        if self.sock is not None:  # the server releases every host this pass held (the hosts stay kept)
            self.sock.close()
            self.sock = None


def _sources_out(msg: dict[str, Any], sources: dict[str, str]) -> dict[str, Any]:
    """``msg`` with each module's source named by its hash, the text kept in ``sources``."""
    if msg.get("op") == "call":
        sources[msg["hash"]] = msg["source"]
        return {**msg, "source": None}
    if msg.get("op") == "sequence":
        steps = []
        for step in msg["steps"]:
            text, digest = step["source"]
            sources[digest] = text
            steps.append({**step, "source": [None, digest]})
        return {**msg, "steps": steps}
    return msg


def _sources_in(msg: dict[str, Any], sources: dict[str, str]) -> dict[str, Any]:
    if msg.get("op") == "call":
        return {**msg, "source": sources[msg["hash"]]}
    if msg.get("op") == "sequence":
        return {**msg, "steps": [{**s, "source": [sources[s["source"][1]], s["source"][1]]} for s in msg["steps"]]}
    return msg


# -- server --------------------------------------------------------------------------------------
@dataclass
class _Held:
    """One host as this command's session holds it on the server."""

    kept: mux_server.KeptHost | None = None
    fresh: set[tuple[int, str]] = field(default_factory=set)


_INFO_FIELDS = tuple(f.name for f in fields(AgentInfo))


def serve_call_many(server: mux_server.MuxServer, conn: socket.socket, msg: dict[str, Any]) -> None:
    """Answer ``msg`` and every later ``call_many`` frame of this connection (one command's pass),
    holding each host between frames as one host's session does; released when the command goes."""
    held: dict[str, _Held] = {}
    threads = max(1, min(int(msg.get("forks") or 32), SERVER_THREADS))  # started as the frames need them
    try:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mux-calls") as pool:  # one per pass
            while msg is not None:
                if msg.get("op") != "call_many":
                    raise ValueError(f"only call_many may follow call_many, not {msg.get('op')!r}")
                _serve_frame(server, conn, msg, held, pool)
                msg = mux.recv_frame(conn)
    finally:
        for one in held.values():
            if one.kept is not None:
                server.release(one.kept)


def _serve_frame(server: mux_server.MuxServer, conn: socket.socket, msg: dict[str, Any],
                 held: dict[str, _Held], pool: ThreadPoolExecutor) -> None:
    server.persist = max(server.persist, float(msg.get("persist") or 0))
    sources = dict(msg.get("sources") or {})
    stat_once = functools.cache(mux_server.file_key)  # each known_hosts and key file stat-ed once per frame
    futures: list[Future[dict[str, Any]] | None] = [
        pool.submit(_answer, server, {**h, "request": _sources_in(h["request"], sources)},
                    held.setdefault(h["host"], _Held()), msg.get("persist"), stat_once) for h in msg["hosts"]]
    sender = FrameSender(conn)
    try:
        for index, future in enumerate(futures):
            assert future is not None  # only those already sent are dropped
            sender.send(index, future.result(), shareable(msg["hosts"][index]["request"]))
            futures[index] = None  # sent: its answer is not held to the frame's end
    except OSError:  # the command went away: the requests not yet started are not made
        for left in futures:
            if left is not None:
                left.cancel()
        raise


def _answer(server: mux_server.MuxServer, host: dict[str, Any], held: _Held, persist: Any,
            stat_key: Callable[[str | None], list[Any]] = mux_server.file_key) -> dict[str, Any]:
    """One host's request, as ``MuxServer._session`` answers it after ``attach``."""
    attached = None
    try:
        if held.kept is None:  # the command's first request to this host: check (or replace) it first
            held.kept = server.attach({**host, "persist": persist}, stat_key)
            assert held.kept.main.info is not None
            attached = {f: getattr(held.kept.main.info, f) for f in _INFO_FIELDS}  # asdict, without its deep copies
        request = host["request"]
        if attached is not None and request.get("op") == "ping":
            result: Any = attached  # attaching pinged the agent: that is this ping (as MuxAgentClient.ping)
        else:
            result, _ = server.handle(request, held.kept, held.fresh, raw=True)  # passed on undecoded
        return {"ok": True, "result": result, "info": attached}
    except Exception as exc:
        if not isinstance(exc, FleetError):
            mux_server.log.exception("request failed")
        if isinstance(exc, ConnectError | AgentError) and held.kept is not None:
            server.forget(held.kept)  # as one host's session: never retried within this command
            held.kept = None
        return {"ok": False, "error": mux.error_payload(exc), "info": attached}
