"""``fleetctl logs --follow``: every selected host's server log lines as they arrive, until Ctrl-C or
until every host's stream ended.

Each host runs ``remote/log_follow.py`` on a channel of its own (``tail -F`` of the supervisor's log,
or ``journalctl -f`` of the unit, per instance); one reader thread per host turns its JSON lines into
events on one queue, so a slow or dropped host never holds up the others. Stopping asks every host's
follower to end and waits (briefly) until it did, so no ``tail`` is left behind.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from fleetctl.release import instances
from fleetctl.release.logs import checked_answer
from fleetctl.release.servers import current_names
from fleetctl.release.service import control, layout_for
from fleetctl.secrets import mask_values, secret_values
from fleetctl.transport.agent import stream_command
from fleetctl.transport.base import Status, Stream
from fleetctl.transport.fleet import Fleet, HostContext

STOP_WAIT_S = 5.0  # how long a stop waits, in all, for the hosts' followers to end


@dataclass(frozen=True)
class FollowEvent:
    """``line``: one log line; ``note``: one instance's follower ended; ``ended``: the host's stream
    ended (``lost``: its connection went, or it could not start)."""

    kind: str
    host: str
    text: str
    instance: str | None = None
    lost: bool = False


def open_follow(ctx: HostContext, lines: int, since: str | None, instance: str | None) -> Stream:
    """Start the host's follower over the instances ``current`` runs (or only ``instance``)."""
    layout = layout_for(ctx.vars)
    names = instances.select(current_names(ctx, layout) or [None], instance, ctx.name)
    sources: list[dict[str, Any]] = []
    for name in names:
        answer = checked_answer(ctx.name, ctx.call("service_host", {**control(layout, "logs", name), "lines": lines,
                                                                    "since": since, "follow": True}), since)
        label = instances.ServerInstance(name).label if len(names) > 1 else None
        sources.append({"label": label, "argv": answer["follow_argv"]})
    return ctx.connector.open_stream(stream_command("log_follow", ctx.agent.interpreters, {"sources": sources}))


class HostReader(threading.Thread):
    """Reads one host's follower: its lines (secrets masked) go onto the shared queue, then one
    ``ended`` event."""

    def __init__(self, host: str, stream: Stream, secrets: list[str], out: queue.Queue[FollowEvent]) -> None:
        super().__init__(name=f"follow-{host}", daemon=True)
        self.host, self.stream, self.secrets, self.out = host, stream, secrets, out
        self.stopping = False

    def run(self) -> None:
        why, partial = "", b""
        try:
            while True:
                data = self.stream.recv(65536, None)
                if not data:
                    break
                *complete, partial = (partial + data).split(b"\n")
                for raw in complete:
                    self._event(raw)
        except Exception as exc:  # the channel broke under us: judged below like an end
            why = f"{type(exc).__name__}: {exc}"
        if self.stopping:
            self.out.put(FollowEvent("ended", self.host, "stopped"))
        elif _connection_lost(self.stream):
            self.out.put(FollowEvent("ended", self.host, "connection lost", lost=True))
        else:  # the follower exited: every source ended (a stderr line says why it could not run)
            note = _stderr_note(self.stream)
            self.out.put(FollowEvent("ended", self.host, why or ("stream ended" + note), lost=bool(why or note)))

    def _event(self, raw: bytes) -> None:
        try:
            doc = json.loads(raw)
        except ValueError:
            return  # login-file noise before the follower started
        if not isinstance(doc, dict):
            return
        text = mask_values(str(doc.get("l", doc.get("end", ""))), self.secrets)
        self.out.put(FollowEvent("line" if "l" in doc else "note", self.host, text, doc.get("i")))


def _connection_lost(stream: Stream) -> bool:
    check = getattr(stream, "connection_lost", None)
    return bool(check()) if check is not None else False


def _stderr_note(stream: Stream) -> str:
    try:
        text = stream.stderr_tail().strip()
    except Exception:
        return ""
    return f": {text.splitlines()[-1]}" if text else ""


def follow(fleet: Fleet, lines: int, since: str | None, instance: str | None
           ) -> Generator[FollowEvent, None, None]:
    """Events from every host until each one's stream ended; closing the iterator (Ctrl-C) stops
    every host's follower first."""
    started = fleet.map(lambda ctx: open_follow(ctx, lines, since, instance))
    events: queue.Queue[FollowEvent] = queue.Queue()
    readers: list[HostReader] = []
    for host, res in started.items():
        if res.ok and res.value is not None:
            reader = HostReader(host, res.value, secret_values(fleet.contexts[host].vars), events)
            reader.start()
            readers.append(reader)
        else:
            why = f"unreachable: {res.reason}" if res.status is Status.UNREACHABLE else res.reason
            yield FollowEvent("ended", host, why, lost=True)
    try:
        live = len(readers)
        while live:
            try:
                event = events.get(timeout=0.5)  # a timeout, so Ctrl-C is seen while all is quiet
            except queue.Empty:
                continue
            live -= event.kind == "ended"
            yield event
    finally:
        stop(readers)


def stop(readers: list[HostReader]) -> None:
    """Ask each host's follower to end (a byte on its stdin), wait until its stream closed (it has
    ended its ``tail``/``journalctl``), then close the channel."""
    for reader in readers:
        reader.stopping = True
        try:
            reader.stream.send(b"stop\n")
        except Exception:
            pass  # already gone
    deadline = time.monotonic() + STOP_WAIT_S
    for reader in readers:
        reader.join(max(0.0, deadline - time.monotonic()))
    for reader in readers:
        try:
            reader.stream.close()
        except Exception:
            pass
