"""``fleetctl models sync``: one round of the chain, seen from the controller. The head of the round
(the source host's node, or a node on this machine) is started with its plan; from then on the
controller only reads the event lines every link relays upstream (ready, progress, done, cut,
refused, sent) and keeps the tally (``Tally``) that the progress display and the report read. In a
relay round the controller also carries the source's frames to its own node (``pump``)."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetctl.overlay.stream import Reader
from fleetctl.transport.base import Stream
from fleetctl.transport.local import PipeStream

EVENT = b"@@FLEETCTL-EV "
MAGIC = b"\x00FLEETCTL-MODEL-1\n"


@dataclass
class HostTally:
    need_bytes: int = 0
    written: int = 0
    started: float = 0.0
    updated: float = 0.0
    done: bool = False
    ok: bool = False
    errors: list[str] = field(default_factory=list)
    cuts: list[str] = field(default_factory=list)
    refused: str = ""
    lost: str = ""

    def rate(self) -> float:
        span = self.updated - self.started
        return self.written / span if span > 0 and self.written else 0.0

    def eta(self) -> float | None:
        rate = self.rate()
        return (self.need_bytes - self.written) / rate if rate > 0 and not self.done else None


@dataclass
class Tally:
    """Everything the rounds learnt, per host; ``on_change`` is the progress display's hook."""

    hosts: dict[str, HostTally]
    source_sent: int = 0
    on_change: Callable[[Tally], None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def apply(self, ev: dict[str, Any]) -> None:
        host = str(ev.get("host", ""))
        kind = ev.get("ev")
        if kind == "sent":
            self.source_sent += int(ev.get("bytes", 0)) if ev.get("source") else 0
            return
        t = self.hosts.get(host)
        if t is None:
            return
        now = time.monotonic()
        if kind == "progress":
            if not t.started:
                t.started = now
            t.written, t.updated = int(ev.get("bytes", 0)), now
        elif kind == "done":
            t.done, t.ok = True, bool(ev.get("ok"))
            t.errors = [str(e) for e in ev.get("errors") or []]
            if not t.ok and ev.get("missing"):
                t.errors.append("not landed: " + ", ".join(ev["missing"]))
        elif kind == "cut":
            t.cuts.append(f"cut from the chain by {ev.get('by') or 'the controller'} ({ev.get('stage')}): "
                          f"{ev.get('why')}")
        elif kind == "refused":
            t.refused = str(ev.get("why"))
        elif kind == "lost":
            t.lost = str(ev.get("why"))
        if self.on_change is not None:
            self.on_change(self)


def local_node(command: str) -> PipeStream:
    """A node on this machine (a source folder here, or the relay), under this Python."""
    return PipeStream(["/bin/sh", "-c", command.replace("exec python3 ", f"exec {sys.executable} ", 1)])


class Events:
    """The event lines of a round's head stream (shell noise and sudo's STARTED skipped)."""

    def __init__(self, stream: Stream, tally: Tally, head: str, source: bool) -> None:
        self.reader, self.stream, self.tally, self.head, self.source = Reader(stream, None), stream, tally, head, source
        self.need: set[int] = set()
        self.failed = ""

    def next(self) -> dict[str, Any] | None:
        """The next event, tallied; None when the stream ended (``failed`` says why, if it broke)."""
        while True:
            try:
                line = self.reader.until(b"\n", limit=1 << 24)
            except EOFError:
                return None
            except Exception as exc:  # the head's connection broke: the round is over
                self.failed = f"{type(exc).__name__}: {exc} {self.stream.stderr_tail().strip()}".strip()
                return None
            start = line.find(EVENT)
            if start < 0:
                continue
            try:
                ev: dict[str, Any] = json.loads(line[start + len(EVENT):])
            except ValueError:
                continue
            if ev.get("host") == self.head:
                if ev.get("ev") == "ready":
                    self.need = set(ev.get("need") or [])
                if ev.get("ev") == "sent":
                    ev["source"] = self.source
            with self.tally.lock:
                self.tally.apply(ev)
            return ev

    def until_ready(self) -> set[int]:
        while True:
            ev = self.next()
            if ev is None or (ev.get("ev") == "ready" and ev.get("host") == self.head):
                return self.need

    def drain(self) -> str:
        """Every event until the stream ends; why the head failed ("" when it did not)."""
        while self.next() is not None:
            pass
        return self.failed


def pump(feed: Stream, relay: Stream, tally: Tally) -> threading.Thread:
    """Carry the source's frames (after its MAGIC) into the relay node, in the background."""

    def carry() -> None:
        reader = Reader(feed, None)
        try:
            reader.until(MAGIC, limit=1 << 20)
            if reader.buf:
                relay.send(bytes(reader.buf))
                tally.source_sent += len(reader.buf)
            while True:
                chunk = feed.recv(1 << 20, None)
                if not chunk:
                    break
                relay.send(chunk)
                tally.source_sent += len(chunk)
        except Exception:  # noqa: S110 - the relay sees its stream end early and says so per host
            pass
        finally:
            proc = getattr(relay, "proc", None)  # EOF: the relay's node ends its round
            if proc is not None and proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()

    thread = threading.Thread(target=carry, daemon=True)
    thread.start()
    return thread
