"""An agent's answer passed on undecoded: what the kept-connection server does with a batched call's result.

The server used to decode each host's answer, encode its result again into the frame for the
command, which decoded it a third time: for ``probe grep`` over a thousand hosts (the largest
answers of any job) most of the controller's CPU and memory. The agent writes every answer as
``{"id": N, "ok": true, "result": ...}`` in that key order (``remote/agent.py``; a large object
result with ``"spans"`` before it: where each top-level value lies), so the server checks that
prefix (the request's own id, and ok) and keeps the message's bytes as they came (``RawResult``);
the command decodes them, once (``mux_answers.py``). Anything else (a failure, another id, another
order, an older agent) is decoded here as ``AgentClient`` always does, with the same errors.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
from dataclasses import dataclass
from typing import Any

from fleetctl.transport.agent import MAX_MESSAGE, AgentClient
from fleetctl.transport.base import Progress

_RAW = threading.local()  # on while this thread's call may come back undecoded (call_raw)


@dataclass(frozen=True)
class RawResult:
    """An agent's whole answer message, its result not decoded. ``start``: where the result's JSON
    begins; ``spans``: where each of its top-level values lies, from ``start`` (empty: not told)."""

    body: bytes
    start: int
    agent_id: int
    spans: tuple[int, ...] = ()

    def digest(self) -> bytes:
        """What tells two hosts' results apart (the ids before them differ)."""
        return hashlib.sha256(memoryview(self.body)[self.start:]).digest()

    def values(self) -> list[tuple[int, int]]:
        """Each top-level value's (first byte, end) in ``body``."""
        return [(self.start + a, self.start + b) for a, b in zip(self.spans[::2], self.spans[1::2], strict=True)]


_HEAD = re.compile(rb'\{"id": (\d+), "ok": true, (?:"spans": \[([\d, ]+)\], )?"result": ')
_KEY = rb'"[^"\\]*": '  # a plain key: no escapes, so two keys that differ in bytes differ decoded
_FIRST_KEY, _NEXT_KEY = re.compile(rb"\{" + _KEY), re.compile(rb", " + _KEY)


def split_answer(body: bytes, want_id: int) -> RawResult | None:
    """``body`` as a ``RawResult`` when it starts exactly as the agent writes a successful answer to
    request ``want_id``; None for anything else (the full decode decides). Spans that do not cut the
    result into ``{KEY: VALUE, ...}`` with plain, distinct keys are dropped (the result passes whole)."""
    head = _HEAD.match(body)
    if head is None or int(head.group(1)) != want_id or not body.endswith(b"}"):
        return None
    start = head.end()
    spans: tuple[int, ...] = ()
    if head.group(2) is not None:
        try:
            spans = tuple(int(n) for n in head.group(2).split(b", "))
        except ValueError:
            spans = ()
        if not _spans_fit(body, start, spans):
            spans = ()
    return RawResult(body, start, want_id, spans)


def _spans_fit(body: bytes, start: int, spans: tuple[int, ...]) -> bool:
    """Whether ``spans`` cut the result (``body[start:-1]``) into ``{KEY: VALUE, KEY: VALUE}``: between
    two values exactly one plain key, every key once, the last value ending at the closing brace."""
    if not spans or len(spans) % 2:
        return False
    keys, at = set(), start
    for i in range(0, len(spans), 2):
        if spans[i + 1] <= spans[i] or start + spans[i] < at:
            return False
        gap = (_NEXT_KEY if i else _FIRST_KEY).fullmatch(body, at, start + spans[i])
        if gap is None:
            return False
        key = gap.group()[1 if i == 0 else 2:]
        if key in keys:
            return False
        keys.add(key)
        at = start + spans[i + 1]
    return at == len(body) - 2  # the result's closing brace, then the answer's


def decode_answer(body: bytes, agent_id: int) -> Any:
    """The result in ``body`` (a ``RawResult``'s bytes), decoded as ``AgentClient`` decodes an answer;
    ValueError when it is not JSON, or not the successful answer to ``agent_id`` its prefix said."""
    answer = json.loads(body)
    if not isinstance(answer, dict) or answer.get("id") != agent_id or answer.get("ok") is not True:
        raise ValueError(f"not the answer to request {agent_id}")
    return answer.get("result")


class PassThroughAgent(AgentClient):
    """``AgentClient`` whose ``call_raw`` gives a successful answer's bytes undecoded."""

    def call_raw(self, module: str, params: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """As ``call``, but a successful answer comes back as a ``RawResult``."""
        _RAW.on = True
        try:
            return self.call(module, params, **kwargs)
        finally:
            _RAW.on = False

    def _request(self, msg: dict[str, Any], timeout: float | None, progress: Progress | None = None) -> Any:
        if progress is not None or msg.get("op") != "call" or not getattr(_RAW, "on", False):
            return super()._request(msg, timeout, progress)
        msg, deadline = self._send(msg, timeout)
        body = self._body(deadline, timeout)
        raw = split_answer(body, msg["id"])
        if raw is not None:
            return raw
        # Not the usual success: put it back and read it as every answer is read (its errors, its checks).
        self._pending = struct.pack(">I", len(body)) + body + self._pending
        return self._answer(msg["id"], msg, deadline, timeout)

    def _body(self, deadline: float | None, timeout: float | None) -> bytes:
        """The next message's bytes; failures as ``AgentClient._message`` reports them."""
        try:
            size = struct.unpack(">I", self._recv_exact(4, deadline))[0]
            if size > MAX_MESSAGE:
                raise self._fail(f"sent a {size}-byte message (limit {MAX_MESSAGE})")
            return self._recv_exact(size, deadline)
        except TimeoutError:
            raise self._timed_out(timeout) from None
        except (EOFError, OSError) as exc:
            raise self._lost(exc) from None
