"""One request for a whole fleet's ping over kept connections (issue 23).

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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar

from fleetctl.errors import AgentError, ConnectError, FleetError
from fleetctl.transport import mux
from fleetctl.transport.agent import AgentInfo

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
        failed = {"ok": False, "error": {"class": "AgentError", "reason": (
            f"persistent-connection server failed ({exc}); `fleetctl connections stop` restarts it")}}
        for _ in range(done, len(contexts)):
            yield failed
    finally:
        sock.close()


# -- server --------------------------------------------------------------------------------------
def serve_ping_many(server: mux.MuxServer, conn: socket.socket, msg: dict[str, Any]) -> None:
    """Attach and ping every host of ``msg`` in parallel; one frame per host, in its order."""
    hosts = list(msg["hosts"])
    persist = float(msg.get("persist") or 0)
    timeout = float(msg.get("timeout") or 30.0)
    threads = max(1, min(len(hosts), int(msg.get("forks") or 32), SERVER_THREADS))
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mux-ping") as pool:
        futures = [pool.submit(_ping_host, server, h, persist, timeout) for h in hosts]
        try:
            for future in futures:
                mux.send_frame(conn, future.result())
        except OSError:  # the command went away (Ctrl-C): the hosts not yet started are not asked
            for future in futures:
                future.cancel()
            raise


def _ping_host(server: mux.MuxServer, host: dict[str, Any], persist: float, timeout: float) -> dict[str, Any]:
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
        return {"ok": True, "info": asdict(kept.main.info), "connect_ms": round((attached - start) * 1000, 1),
                "rtt_ms": round(rtt * 1000, 2)}
    except Exception as exc:
        if isinstance(exc, ConnectError | AgentError):
            server.forget(kept)
        return _failed(exc)
    finally:
        server.release(kept)


def _failed(exc: BaseException) -> dict[str, Any]:
    if not isinstance(exc, FleetError):
        mux.log.exception("ping failed")
    return {"ok": False, "error": mux.error_payload(exc)}
