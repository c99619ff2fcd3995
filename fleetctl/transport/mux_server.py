"""The kept-connection server (``--persist``): one process per user that holds each host's SSH
connection and agents between commands and answers their requests over a Unix socket. Started by
``mux.connect`` as ``python -m fleetctl.transport.mux_server SOCKET SECONDS``; the protocol, the
client and the safety decisions are in ``mux.py``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import (
    AgentError,
    ConnectError,
    FleetError,
    RemoteOperationError,
)
from fleetctl.transport.agent_pass import PassThroughAgent
from fleetctl.transport.base import Step
from fleetctl.transport.mux import (
    error_payload,
    recv_frame,
    send_frame,
    target_from_doc,
)

if TYPE_CHECKING:
    from fleetctl.transport.ssh import SSHConnector, SSHTarget

log = logging.getLogger("fleetctl.mux")


def file_key(path: str | None) -> list[Any]:
    if not path:
        return []
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_size, st.st_mtime_ns, st.st_ino]


def entry_key(host: str, target: dict[str, Any], interpreters: list[str],
              stat_key: Callable[[str | None], list[Any]] = file_key) -> str:
    """Everything that decides a connection and its trust; any change means a new connection.
    ``stat_key``: how a file is told apart (a request for many hosts stats each file once)."""
    parts: list[Any] = [host, target, interpreters]
    hop: dict[str, Any] | None = target
    while hop:
        parts += [stat_key(hop.get("known_hosts")), *(stat_key(k) for k in hop.get("key_files") or ())]
        hop = hop.get("jump")
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class KeptHost:
    """One host's kept connection and its agents (one per interpreter asked for)."""

    def __init__(self, host: str, target: SSHTarget, interpreters: list[str]) -> None:
        from fleetctl.transport.ssh import SSHConnector

        self.host = host
        self.connector: SSHConnector = SSHConnector(host, target)
        self.main = PassThroughAgent(host, self.connector, interpreters, start_timeout=target.agent_start_s)
        self.others: dict[str, PassThroughAgent | None] = {}  # python -> its agent (None: it would not start)
        self.lock = threading.Lock()  # guards ``others``
        self.last_used = time.monotonic()
        self.users = 0
        self.checked = False  # the last attach found it kept and checked it with one round trip

    def agent_for(self, python: str | None) -> tuple[PassThroughAgent, str | None]:
        """The agent that runs a call under ``python`` itself, or the main agent and a child python."""
        main_python = self.main.info.python if self.main.info else None
        if python is None or python == main_python:
            return self.main, None
        with self.lock:
            if python not in self.others:
                agent: PassThroughAgent | None = PassThroughAgent(
                    self.host, self.connector, [python], start_timeout=self.connector.target.agent_start_s)
                try:
                    assert agent is not None
                    agent.ping()
                except (AgentError, OSError):
                    # Not there, or not a python: the main agent's child path says so as it always has.
                    agent = None
                self.others[python] = agent
            found = self.others[python]
        return (found, None) if found is not None else (self.main, python)

    def close(self) -> None:
        for agent in [self.main, *(a for a in self.others.values() if a is not None)]:
            with contextlib.suppress(Exception):
                agent.close()
        with contextlib.suppress(Exception):
            self.connector.close()


BatchOp = Callable[["MuxServer", socket.socket, dict[str, Any]], None]


class MuxServer:
    def __init__(self, path: Path, persist: float,
                 batch_ops: dict[str, BatchOp] | None = None) -> None:
        self.path = path
        self.batch_ops = batch_ops or {}  # ops answered with one frame per host (mux_batch), given by mux_main
        self.persist = persist
        self.hosts: dict[str, KeptHost] = {}
        self.lock = threading.Lock()
        self.sessions = 0
        self.last_active = time.monotonic()
        self.stopping = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------
    def serve(self) -> int:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.path))
        finally:
            os.umask(old)
        listener.listen(256)
        listener.settimeout(0.5)
        pid_file = self.path.with_suffix(".pid")  # for `connections list` and the benchmarks' CPU meter
        fd = os.open(pid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
        try:
            while not self.stopping.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    self._expire()
                    continue
                threading.Thread(target=self._session, args=(conn,), daemon=True).start()
        finally:
            for done in (self.path, pid_file):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(done)
            listener.close()
            self.close_all()
        return 0

    def _expire(self) -> None:
        now = time.monotonic()
        with self.lock:
            if self.sessions == 0 and now - self.last_active > self.persist:
                self.stopping.set()
                return
            idle = [k for k, h in self.hosts.items() if h.users == 0 and now - h.last_used > self.persist]
            gone = [self.hosts.pop(k) for k in idle]
        for kept in gone:
            kept.close()

    def close_all(self) -> int:
        with self.lock:
            kept, self.hosts = list(self.hosts.values()), {}
        threads = [threading.Thread(target=k.close, daemon=True) for k in kept]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        return len(kept)

    # -- one client connection (one host of one command) -------------------------------------
    def _session(self, conn: socket.socket) -> None:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.geteuid():
            conn.close()  # only our own user may use our connections
            return
        with self.lock:
            self.sessions += 1
        kept: KeptHost | None = None
        fresh: set[tuple[int, str]] = set()
        try:
            while True:
                msg = recv_frame(conn)
                if msg is None:
                    return
                batch = self.batch_ops.get(msg.get("op"))
                if batch is not None:  # a whole fleet's ping: one frame back per host
                    batch(self, conn, msg)
                    continue
                try:
                    result, kept = self.handle(msg, kept, fresh)
                    send_frame(conn, {"ok": True, "result": result})
                except Exception as exc:  # the client raises it as the same class
                    if not isinstance(exc, FleetError):
                        log.exception("request failed")
                    if isinstance(exc, ConnectError | AgentError) and kept is not None:
                        self.forget(kept)
                        kept = None
                    send_frame(conn, {"ok": False, "error": error_payload(exc)})
        except (OSError, EOFError, ValueError) as exc:  # the command went away, or sent what is not a frame
            log.warning("session ended: %s: %s", type(exc).__name__, exc)
        except Exception:
            log.exception("session failed")
        finally:
            conn.close()
            with self.lock:
                self.sessions -= 1
                self.last_active = time.monotonic()
                if kept is not None:
                    kept.users -= 1
                    kept.last_used = time.monotonic()

    def handle(self, msg: dict[str, Any], kept: KeptHost | None, fresh: set[tuple[int, str]],
               raw: bool = False) -> tuple[Any, KeptHost | None]:
        """``msg``'s answer; ``raw``: a call's successful result may come back undecoded (agent_pass.RawResult)."""
        op = msg.get("op")
        if op == "attach":
            kept = self.attach(msg)
            assert kept.main.info is not None
            return asdict(kept.main.info), kept
        if op == "list":
            return self._list(), kept
        if op == "detach":  # the command is done with this host: `connections list` shows it idle at once
            if kept is not None:
                self.release(kept)
            return None, None
        if op == "stop":
            held = self.close_all()
            self.stopping.set()
            return held, kept
        if kept is None:
            raise ValueError("attach first")
        kept.last_used = time.monotonic()
        if op == "ping":
            return asdict(kept.main.ping(float(msg.get("timeout") or 30.0))), kept
        if op == "call":
            agent, python = kept.agent_for(msg.get("python"))
            first = (id(agent), msg["module"]) not in fresh
            fresh.add((id(agent), msg["module"]))
            call = agent.call_raw if raw else agent.call
            return call(msg["module"], msg.get("params"), python=python, timeout=msg.get("timeout"),
                        source=(msg["source"], msg["hash"]), fresh=first), kept
        if op == "sequence":  # answered as raw per-step answers: the client turns them into outcomes
            steps = []
            for s in msg["steps"]:
                first = (id(kept.main), s["module"]) not in fresh
                fresh.add((id(kept.main), s["module"]))
                steps.append(Step(s["module"], s["params"], (s["source"][0], s["source"][1]), first))
            done = kept.main.sequence(steps, timeout=msg.get("timeout"))
            return [{"ok": True, "result": d} if not isinstance(d, RemoteOperationError) else
                    {"ok": False, "error": {"type": d.etype, "message": d.remote_message,
                                            "traceback": d.remote_traceback}} for d in done], kept
        raise ValueError(f"unknown op {op!r}")

    def attach(self, msg: dict[str, Any], stat_key: Callable[[str | None], list[Any]] = file_key) -> KeptHost:
        """``msg``'s host, kept or connected now, checked with one round trip (``stat_key``: as entry_key)."""
        host, target, interpreters = msg["host"], msg["target"], list(msg["interpreters"])
        self.persist = max(self.persist, float(msg.get("persist") or 0))
        key = entry_key(host, target, interpreters, stat_key)
        while True:
            with self.lock:
                kept = self.hosts.get(key)
                if kept is None:
                    kept = self.hosts[key] = KeptHost(host, target_from_doc(target), interpreters)
                kept.users += 1
            was_kept = kept.main.info is not None
            try:
                kept.main.ping(kept.connector.target.connect_timeout)  # starts it, or checks a kept one
                kept.checked = was_kept
                return kept
            except Exception as exc:
                self.forget(kept)
                if not was_kept or not isinstance(exc, AgentError | ConnectError):
                    raise
                # It went away while kept (host rebooted, sshd restarted): a new connection,
                # before this command sent any request.

    def release(self, kept: KeptHost) -> None:
        """One command is done with ``kept`` (it stays kept)."""
        with self.lock:
            kept.users -= 1
            kept.last_used = time.monotonic()

    def forget(self, kept: KeptHost) -> None:
        with self.lock:
            for key, value in list(self.hosts.items()):
                if value is kept:
                    del self.hosts[key]
        kept.close()

    def _list(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self.lock:
            kept = sorted(self.hosts.values(), key=lambda k: k.host)
        return [{
            "host": k.host, "address": f"{k.connector.target.user}@{k.connector.target.hostname}:"
                                       f"{k.connector.target.port}"
                                       + (f" (sudo -u {k.connector.target.become.user})"
                                          if k.connector.target.become else ""),
            "pythons": [p for p in [k.main.info.python if k.main.info else None,
                                    *(p for p, a in k.others.items() if a is not None)] if p],
            "idle_s": round(now - k.last_used, 1), "in_use": k.users > 0,
        } for k in kept]
