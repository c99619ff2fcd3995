"""One request for a whole fleet's ping over kept connections.

A command over kept connections used to open one socket session per host, each in a thread of
its own, and ask the server twice per host (attach, then ping): at 200 hosts that was 200 client
threads, 600 socket messages and 400 agent round trips inside the server. Here the client sends
every host in one ``ping_many`` request; the server attaches each host on a bounded pool of its
own threads (a kept connection's attach check is the round trip that answers the ping; a fresh
one pings once more so its round-trip time is measured on the open channel) and streams one
answer per host back, in the request's order. The client has no thread per host and reads one
socket. Each host's trust, timeout and result are exactly what ``attach`` gives a single host:
the same host-key checks, a dead kept connection replaced before its ping, per-host errors.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

from fleetctl.errors import AgentError, ConnectError, FleetError
from fleetctl.transport import mux, mux_server
from fleetctl.transport.agent import AgentInfo, PingInFlight

if TYPE_CHECKING:
    import socket

    from fleetctl.transport.base import HostResult
    from fleetctl.transport.fleet import Fleet, HostContext

T = TypeVar("T")
PING_TIMEOUT_S = 30.0  # a ping's answer, once connected (as MuxAgentClient.ping)
SERVER_THREADS = 64  # the server's pool for one request: round trips overlap, the GIL bounds the rest


# -- client --------------------------------------------------------------------------------------
def ping_kept(fleet: Fleet, one: Callable[[HostContext], T],
              made: Callable[[AgentInfo, float, float], T]) -> dict[str, HostResult[T]]:
    """Every host pinged: those on kept connections in one request to the server (``made`` builds
    each value from the agent's info, first-contact ms and round-trip ms), any other host (a local
    one) through ``one`` as ``Fleet.map`` does. Results in host order."""
    order = sorted(fleet.contexts)
    kept = [n for n in order if isinstance(fleet.contexts[n].agent, mux.MuxAgentClient)]
    results: dict[str, HostResult[T]] = {}
    others = [n for n in order if n not in set(kept)]
    if others:
        results.update(fleet.map(one, names=others))
    if kept:
        answers = _ask_many([fleet.contexts[n] for n in kept], fleet.settings.persist, fleet.settings.forks)
        for name, answer in zip(kept, answers, strict=True):
            results[name] = fleet.run_one(fleet.contexts[name], functools.partial(_value, answer=answer, made=made))
    return {n: results[n] for n in order}


def _value(ctx: HostContext, answer: dict[str, Any], made: Callable[[AgentInfo, float, float], T]) -> T:
    if not answer.get("ok"):
        mux.raise_payload(ctx.name, answer.get("error") or {})
    info = AgentInfo(**answer["info"])
    ctx.agent.info = info
    return made(info, float(answer["connect_ms"]), float(answer["rtt_ms"]))


def _ask_many(contexts: list[HostContext], persist: float, forks: int) -> Iterator[dict[str, Any]]:
    """One answer per context, in order; a server that fails part-way fails the hosts left."""
    first = contexts[0].agent
    assert isinstance(first, mux.MuxAgentClient)
    hosts = []
    for ctx in contexts:
        agent = ctx.agent
        assert isinstance(agent, mux.MuxAgentClient)
        hosts.append({"host": ctx.name, "target": mux.target_doc(agent.target), "interpreters": agent.interpreters})
    sock = mux.connect(first.path, persist)
    done = 0
    try:
        mux.send_frame(sock, {"op": "ping_many", "hosts": hosts, "persist": persist, "forks": forks,
                              "timeout": PING_TIMEOUT_S})
        while done < len(contexts):
            answer = mux.recv_frame(sock)
            if answer is None:
                raise EOFError("the persistent-connection server closed the connection")
            done += 1
            yield dict(answer)
    except (OSError, EOFError, ValueError) as exc:
        failed = {"ok": False, "error": {"class": "AgentError", "reason": mux.server_failed(first.path, exc)}}
        for _ in range(done, len(contexts)):
            yield failed
    finally:
        sock.close()


# -- server --------------------------------------------------------------------------------------
IN_FLIGHT = 16  # kept hosts' pings outstanding at once: round trips overlap, each rtt stays its own
STALL_S = 0.5  # an answer slower than this (a frozen host) lets every other host's ping go out meanwhile


@dataclass
class _Flight:
    """One kept host's ping, sent and not yet answered."""

    kept: mux_server.KeptHost
    sent: PingInFlight
    start: float


def serve_ping_many(server: mux_server.MuxServer, conn: socket.socket, msg: dict[str, Any]) -> None:
    """Ping every host of ``msg``; one frame per host, in its order.

    The kept hosts' pings go out from this one thread, a window of them in flight, each answer
    read in turn: their round trips overlap without a thread each (at 200 hosts the hand-offs
    between a thread per host were most of the server's CPU). A host not kept yet, one whose
    agent another command is using, or one whose kept connection turns out dead, is attached on
    the pool as ``attach`` does for one host: a fresh connection, strict host keys, its own error."""
    hosts = list(msg["hosts"])
    persist = float(msg.get("persist") or 0)
    timeout = float(msg.get("timeout") or 30.0)
    server.persist = max(server.persist, persist)
    threads = max(1, min(len(hosts), int(msg.get("forks") or 32), SERVER_THREADS))
    stat_once = functools.cache(mux_server.file_key)  # each known_hosts and key file stat-ed once per request
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mux-ping") as pool:
        attached: dict[int, Future[dict[str, Any]]] = {}

        def attach(i: int) -> None:
            attached[i] = pool.submit(_ping_host, server, hosts[i], persist, timeout)

        kept = {}
        for i, host in enumerate(hosts):
            found = _take_kept(server, host, stat_once)
            if found is None:
                attach(i)
            else:
                kept[i] = found
        pings = _KeptPings(server, kept, attach, min(IN_FLIGHT, threads))
        try:
            for i in range(len(hosts)):
                answer = pings.answer(i)
                if answer is None:
                    pings.settle()  # no waiting on another host while this thread holds agents
                    answer = attached[i].result()
                mux.send_frame(conn, answer)
        except OSError:  # the command went away (Ctrl-C): the hosts not yet started are not asked
            for future in attached.values():
                future.cancel()
            raise
        finally:
            pings.close()


class _KeptPings:
    """The kept hosts' pings of one request, in request order, at most ``window`` outstanding."""

    def __init__(self, server: mux_server.MuxServer, kept: dict[int, mux_server.KeptHost],
                 attach: Callable[[int], None], window: int) -> None:
        self.server = server
        self.window = window
        self.unsent = deque(sorted(kept.items()))
        self.flights: dict[int, _Flight] = {}
        self.answers: dict[int, dict[str, Any]] = {}
        self.attach = attach  # a host whose kept agent cannot answer here: attached on the pool

    def answer(self, i: int) -> dict[str, Any] | None:
        """Host ``i``'s answer (every lower host's was taken); None: it is attached on the pool."""
        self._top_up()
        flight = self.flights.pop(i, None)
        if flight is not None:
            answer = self._read(i, flight)
            self._top_up()
            return answer
        return self.answers.pop(i, None)

    def settle(self) -> None:
        """Read every answer in flight (kept for its turn)."""
        while self.flights:
            i = min(self.flights)
            answer = self._read(i, self.flights.pop(i))
            if answer is not None:
                self.answers[i] = answer

    def close(self) -> None:
        """No host held, and nothing left in flight (each agent between two requests)."""
        for _i, kept in self.unsent:
            self.server.release(kept)
        self.unsent.clear()
        self.settle()

    def _top_up(self) -> None:
        while self.unsent and len(self.flights) < self.window:
            i, kept = self.unsent.popleft()
            start = time.perf_counter()
            try:
                sent = kept.main.send_ping(kept.connector.target.connect_timeout)  # the check attach makes
            except Exception:  # it died while kept: a fresh connection, as attach replaces it
                self.server.forget(kept)
                sent = None
            if sent is None:  # or its agent is busy with another command's request: attach waits for it
                self.server.release(kept)
                self.attach(i)
            else:
                self.flights[i] = _Flight(kept, sent, start)

    def _read(self, i: int, flight: _Flight) -> dict[str, Any] | None:
        kept = flight.kept
        if not kept.main.ping_arrived(flight.sent, STALL_S):
            # A host this slow (frozen, or its link down) must not hold the others' pings back until
            # its timeout: they all go out now, so many such hosts time out together, not in turn.
            self.window = len(self.unsent) + len(self.flights) + 1
            self._top_up()
        try:
            info = kept.main.ping_answer(flight.sent)
        except Exception as exc:
            self.server.forget(kept)
            self.server.release(kept)
            if isinstance(exc, AgentError | ConnectError):  # it died while kept: a fresh connection
                self.attach(i)
                return None
            return _failed(exc)
        ms = (time.perf_counter() - flight.start) * 1000
        self.server.release(kept)
        return {"ok": True, "info": _info_doc(info), "connect_ms": round(ms, 1), "rtt_ms": round(ms, 2)}


def _take_kept(server: mux_server.MuxServer, host: dict[str, Any],
               stat_key: Callable[[str | None], list[Any]]) -> mux_server.KeptHost | None:
    """``host``'s kept connection with a running agent, counted as in use; None: attach it."""
    try:
        key = mux_server.entry_key(host["host"], host["target"], list(host["interpreters"]), stat_key)
    except Exception:  # a malformed host: attach says what is wrong, for that host alone
        return None
    with server.lock:
        kept = server.hosts.get(key)
        if kept is None or kept.main.info is None:
            return None
        kept.users += 1
        return kept


def _info_doc(info: AgentInfo) -> dict[str, Any]:
    return {f: getattr(info, f) for f in _INFO_FIELDS}  # not asdict: its deep copies, host by host


_INFO_FIELDS = tuple(f.name for f in fields(AgentInfo))


def _ping_host(server: mux_server.MuxServer, host: dict[str, Any], persist: float, timeout: float) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        kept = server.attach({**host, "persist": persist})
    except Exception as exc:
        return _failed(exc)
    try:
        attached = time.perf_counter()
        if kept.checked:  # the attach check was one request on the open agent channel
            rtt = attached - start
        else:  # a new connection: its hello answered the attach; one more round trip to time it
            kept.main.ping(timeout)
            rtt = time.perf_counter() - attached
        assert kept.main.info is not None
        return {"ok": True, "info": _info_doc(kept.main.info), "connect_ms": round((attached - start) * 1000, 1),
                "rtt_ms": round(rtt * 1000, 2)}
    except Exception as exc:
        if isinstance(exc, ConnectError | AgentError):
            server.forget(kept)
        return _failed(exc)
    finally:
        server.release(kept)


def _failed(exc: BaseException) -> dict[str, Any]:
    if not isinstance(exc, FleetError):
        mux_server.log.exception("ping failed")
    return {"ok": False, "error": mux.error_payload(exc)}
