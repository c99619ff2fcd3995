"""One ``call_many`` frame's answers on the wire: results passed through, what hosts answered alike sent once.

A host's successful call comes back from its agent as bytes the server does not decode
(``agent_pass.RawResult``). The server sends it as a header frame ``{"ok": true, "info": ..,
"raw": ID}`` (ID: the agent's request id, which the server checked) followed by one frame of the
agent's message as it came. For a module whose result the command may share between hosts
(``SHARED_MODULES``), what an earlier host of the same frame sent is not sent again:
- the very same result bytes (a thousand hosts of one install): the header says ``"same": K``
  (K: that host's place in the frame) and no bytes follow;
- a large top-level value of the result that an earlier host sent alike (``probe grep``'s files
  and lines, beside a timing that differs on every host): the value is cut out of the bytes sent
  (``null`` in its place) and the header's ``"refs"`` lists ``[ENTRY, K, K_ENTRY]`` for each.
Every other answer is one frame, as before.

The command decodes what it gets once, checking the id and ok once more as ``AgentClient``
does, and puts the shared values in. Hosts that answered alike then hold the one decoded
object: only for modules whose every reader only reads the result.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from fleetctl.transport import mux
from fleetctl.transport.agent_pass import RawResult, decode_answer

if TYPE_CHECKING:
    import socket

# Modules whose decoded result no host function or renderer changes (checked 2026-12-05), so one
# object may serve every host that answered it alike:
#   source         probe grep: GrepHostResult.from_dict builds its own objects (counts copied)
#   facts          facts, gpu health, report: parse_facts / parse_gpu_facts / parse_venv read only
#   venv_packages  facts --venv: parse_venv copies the packages and duplicates
#   distributions  drift, report: parse_inventory reads; markers and files are read, never changed
# Not shared: service_host (status / report's server_status pops "command" and "log_tail" from its
# answer), and every module not listed: each host decodes its own.
SHARED_MODULES = frozenset({"source", "facts", "venv_packages", "distributions"})
PART_MIN = 1024  # a top-level value shorter than this is sent again (its hash would cost more)


def shareable(msg: dict[str, Any]) -> bool:
    """Whether hosts that answer ``msg`` alike may share one decoded result."""
    return msg.get("op") == "call" and msg.get("module") in SHARED_MODULES


class FrameSender:
    """The server's half: one frame's answers, in host order."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.sent: dict[bytes, int] = {}  # a whole result's digest -> the host (place) that sent it
        self.parts: dict[bytes, tuple[int, int]] = {}  # a value's digest -> (host, entry) that sent it

    def send(self, index: int, answer: dict[str, Any], share: bool) -> None:
        result = answer.get("result")
        if not isinstance(result, RawResult):
            mux.send_frame(self.conn, answer)
            return
        head: dict[str, Any] = {"ok": True, "info": answer.get("info"), "raw": result.agent_id}
        if not share:
            mux.send_frame(self.conn, head)
            mux.send_bytes(self.conn, result.body)
            return
        first = self.sent.setdefault(result.digest(), index)
        if first != index:
            mux.send_frame(self.conn, {**head, "same": first})
            return
        refs, cuts = self._refs(index, result)
        if result.spans:
            head["entries"] = len(result.spans) // 2
        if refs:
            head["refs"] = refs
        mux.send_frame(self.conn, head)
        mux.send_bytes(self.conn, _cut(result.body, cuts) if cuts else result.body)

    def _refs(self, index: int, result: RawResult) -> tuple[list[list[int]], list[tuple[int, int]]]:
        """Which large values of ``result`` an earlier host sent: ``[entry, host, its entry]`` each, and
        where they lie in the bytes."""
        refs, cuts = [], []
        view = memoryview(result.body)
        for entry, (begin, end) in enumerate(result.values()):
            if end - begin < PART_MIN:
                continue
            where = self.parts.setdefault(hashlib.sha256(view[begin:end]).digest(), (index, entry))
            if where != (index, entry):
                refs.append([entry, *where])
                cuts.append((begin, end))
        return refs, cuts


def _cut(body: bytes, cuts: list[tuple[int, int]]) -> bytes:
    """``body`` with each ``(begin, end)`` range (in order) replaced by ``null``."""
    pieces, at = [], 0
    for begin, end in cuts:
        pieces += [body[at:begin], b"null"]
        at = end
    pieces.append(body[at:])
    return b"".join(pieces)


class FrameReader:
    """The command's half: one frame's answers, each as ``{"ok", "result" | "error", "info"}``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.outcomes: dict[int, dict[str, Any]] = {}  # place -> a raw answer's outcome (for "same")
        self.values: dict[int, list[Any]] = {}  # place -> its result's top-level values (for "refs")

    def read(self, index: int) -> dict[str, Any]:
        """The answer of the frame's ``index``-th host. A broken stream raises (the pass fails)."""
        answer = mux.recv_frame(self.sock)
        if answer is None:
            raise EOFError("the persistent-connection server closed the connection")
        answer = dict(answer)
        if "raw" not in answer:
            return answer
        info = answer.get("info")
        if "same" in answer:
            same = self.outcomes.get(answer["same"]) if isinstance(answer["same"], int) else None
            if same is None:
                raise ValueError(f"answer {index} refers to answer {answer['same']!r}, which was not sent")
            return {**same, "info": info}
        body = mux.recv_bytes(self.sock)
        if body is None:
            raise EOFError("the persistent-connection server closed the connection")
        outcome = self._outcome(body, int(answer["raw"]), answer.get("entries"), answer.get("refs") or [])
        self.outcomes[index] = outcome
        if outcome["ok"] and answer.get("entries") is not None:
            self.values[index] = list(outcome["result"].values())
        return {**outcome, "info": info}

    def _outcome(self, body: bytes, agent_id: int, entries: Any, refs: list[Any]) -> dict[str, Any]:
        """``body`` decoded into an answer, the values an earlier host sent put in; what is not the
        agent's answer fails this host alone (an AgentError, as the server's own decoding gave)."""
        try:
            result = decode_answer(body, agent_id)
            if entries is not None and (not isinstance(result, dict) or len(result) != entries):
                raise ValueError(f"its result has not the {entries} entries its spans said")
            keys = list(result) if refs else []
            for entry, host, host_entry in refs:
                result[keys[entry]] = self.values[host][host_entry]
        except (ValueError, LookupError, TypeError) as exc:  # json's JSONDecodeError is a ValueError
            return {"ok": False, "error": {"class": "AgentError",
                                           "reason": f"agent answered with what is not its answer ({exc})"}}
        return {"ok": True, "result": result}
