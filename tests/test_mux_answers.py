"""Agents' answers passed through the kept-connection server undecoded, and what hosts answered alike
sent once (transport/agent_pass.py, transport/mux_answers.py). Real agents (run locally, no SSH)
and the real frame code over a socket pair; the lab tests are in test_e2e_kept_batch.py."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl.errors import RemoteOperationError
from fleetctl.transport import agent_pass, mux_answers
from fleetctl.transport.agent_pass import PassThroughAgent, RawResult, split_answer
from fleetctl.transport.local import LocalConnector
from fleetctl.transport.mux_answers import FrameReader, FrameSender

REMOTE_AGENT = Path(agent_pass.__file__).resolve().parent.parent / "remote" / "agent.py"


def _remote_agent() -> Any:
    """The host side's agent module, loaded as a module (its main() is not run)."""
    spec = importlib.util.spec_from_file_location("fleetctl_agent_under_test", REMOTE_AGENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _encode(result: Any, answer_id: int = 7, ok: bool = True) -> bytes:
    agent = _remote_agent()
    return bytes(agent.encode_answer({"ok": ok, "result" if ok else "error": result, "id": answer_id}))


BIG = {"files": [{"path": "sglang/srt/a.py", "text": "x" * 5000}], "counts": {"DFLASH": 3}, "elapsed_ms": 12.5}


# -- the host's encoding and the server's parser ---------------------------------------------------
def test_a_large_answer_says_where_each_value_lies_and_decodes_as_before() -> None:
    body = _encode(BIG)
    assert body.startswith(b'{"id": 7, "ok": true, "spans": [')
    assert json.loads(body)["result"] == BIG  # what a fresh connection's client reads: unchanged
    raw = split_answer(body, 7)
    assert raw is not None and raw.agent_id == 7 and len(raw.spans) == 6
    assert [json.loads(body[a:b]) for a, b in raw.values()] == list(BIG.values())
    assert json.loads(body[raw.start:-1]) == BIG


def test_a_small_answer_has_id_and_ok_first_and_no_spans() -> None:
    body = _encode({"pid": 5})
    assert body == b'{"id": 7, "ok": true, "result": {"pid": 5}}'
    raw = split_answer(body, 7)
    assert raw == RawResult(body, len(b'{"id": 7, "ok": true, "result": '), 7, ())
    assert split_answer(_encode([1, 2], 3), 3) is not None  # any JSON result passes whole


@pytest.mark.parametrize("body", [
    b'{"ok": true, "id": 7, "result": {"a": 1}}',  # keys in another order
    b'{"ok": true, "result": {"a": 1}, "id": 7}',  # the order before this change: id last
    b'{"id": 7, "ok": false, "error": {"type": "ValueError", "message": "no"}}',  # a failure
    b'{"id": 8, "ok": true, "result": {"a": 1}}',  # another request's answer
    b'{"id": 7, "ok": true, "result": [1, 2',  # truncated (one that ends in a brace fails to decode: below)
    b'{"id": 7,"ok":true,"result":{"a": 1}}',  # another encoder's separators
    b'',
])
def test_what_is_not_the_usual_success_is_left_to_the_full_decode(body: bytes) -> None:
    assert split_answer(body, 7) is None


def _with_spans(entries: list[tuple[bytes, bytes]], spans: list[int] | None = None) -> bytes:
    """An answer whose result holds ``entries`` (raw key, raw value), with its true spans or ``spans``."""
    result, true = b"{", []
    for i, (key, value) in enumerate(entries):
        result += (b", " if i else b"") + key + b": "
        true += [len(result), len(result) + len(value)]
        result += value
    told = true if spans is None else spans
    return b'{"id": 7, "ok": true, "spans": %s, "result": %s}}' % (json.dumps(told).encode(), result)


FILES = [(b'"a"', b"1"), (b'"files"', b'"' + b"x" * 3029 + b'"')]


def test_true_spans_are_kept() -> None:
    raw = split_answer(_with_spans(FILES), 7)
    assert raw is not None and raw.spans == (6, 7, 18, 3049)


@pytest.mark.parametrize("spans", [
    [6, 7, 18, 20],  # the last value does not end at the closing brace
    [6, 9, 18, 3049],  # a value cut into the next key
    [6, 7, 6, 7],  # the same value twice
    [6, 7, 18],  # odd
])
def test_spans_that_do_not_cut_the_result_into_its_values_are_dropped(spans: list[int]) -> None:
    raw = split_answer(_with_spans(FILES, spans), 7)
    assert raw is not None and raw.spans == ()  # passed on whole, never split


@pytest.mark.parametrize("entries", [
    [(b'"a"', b"1"), (b'"a"', b"2")],  # a key twice: decoded, one entry
    [(b'"\\u0061"', b"1"), (b'"b"', b"2")],  # an escaped key: which bytes decode alike is not checked
])
def test_repeated_or_escaped_keys_drop_the_spans(entries: list[tuple[bytes, bytes]]) -> None:
    raw = split_answer(_with_spans(entries), 7)
    assert raw is not None and raw.spans == ()


# -- a real agent, undecoded ------------------------------------------------------------------------
@pytest.fixture
def agents() -> Iterator[list[PassThroughAgent]]:
    started = [PassThroughAgent(f"local{i}", LocalConnector(f"local{i}"), ["/usr/bin/python3"]) for i in range(3)]
    yield started
    for agent in started:
        agent.close()


def test_call_raw_gives_the_bytes_of_a_success_and_raises_a_failure_as_call(agents: list[PassThroughAgent]) -> None:
    agent = agents[0]
    raw = agent.call_raw("selftest", {"action": "big", "size": 5000})
    assert isinstance(raw, RawResult) and json.loads(raw.body)["result"] == {"data": "x" * 5000}
    with pytest.raises(RemoteOperationError) as failed:
        agent.call_raw("selftest", {"action": "raise", "message": "no"})
    assert failed.value.op == "selftest"
    assert agent.call("selftest", {"action": "big", "size": 10}) == {"data": "x" * 10}  # in step; call untouched


# -- the frame: each distinct result, and each value hosts share, sent once -----------------------
class Wire:
    """Both ends of a socket pair; what the server's end sent counted."""

    def __init__(self) -> None:
        self.sock, self.client = socket.socketpair()
        self.sent = 0

    def sendall(self, data: bytes) -> None:
        self.sent += len(data)
        self.sock.sendall(data)


def _exchange(answers: list[dict[str, Any]], share: bool) -> tuple[list[dict[str, Any]], int]:
    wire = Wire()
    out: list[dict[str, Any]] = []
    frame = FrameReader(wire.client)
    reader = threading.Thread(target=lambda: out.extend(frame.read(i) for i in range(len(answers))))
    reader.start()
    sender = FrameSender(wire)  # type: ignore[arg-type]
    for i, answer in enumerate(answers):
        sender.send(i, answer, share)
    reader.join(30)
    wire.sock.close()
    wire.client.close()
    return out, wire.sent


def test_identical_results_cross_once_and_the_command_holds_one_object(agents: list[PassThroughAgent]) -> None:
    answers = [{"ok": True, "info": None, "result": a.call_raw("selftest", {"action": "big", "size": 200_000})}
               for a in agents]
    got, sent = _exchange(answers, share=True)
    assert [g["result"] for g in got] == [{"data": "x" * 200_000}] * 3
    assert got[0]["result"] is got[1]["result"] is got[2]["result"]
    assert 200_000 < sent < 201_000  # one result's bytes, not three
    alone, sent_alone = _exchange(answers, share=False)  # a module whose readers may change it
    assert alone[0]["result"] == alone[2]["result"] and alone[0]["result"] is not alone[2]["result"]
    assert sent_alone > 600_000


def test_a_large_value_hosts_share_crosses_once_beside_what_differs(agents: list[PassThroughAgent]) -> None:
    lines = "y" * 100_000
    answers = [{"ok": True, "info": {"pid": i}, "result": a.call_raw("selftest", {"action": "echo", "data": lines})}
               for i, a in enumerate(agents)]  # the same data; each agent's own pid
    other = agents[1].call_raw("selftest", {"action": "echo", "data": "z" * 100_000})  # one host differs
    failed = {"ok": False, "info": None, "error": {"class": "ConnectError", "reason": "gone"}}  # one fails
    got, sent = _exchange([answers[0], {**answers[1], "result": other}, failed, answers[2]], share=True)
    pids = [a.info.pid for a in agents if a.info]
    assert [g.get("result") for g in got] == [{"echo": lines, "pid": pids[0]}, {"echo": "z" * 100_000, "pid": pids[1]},
                                              None, {"echo": lines, "pid": pids[2]}]
    assert got[2] == failed  # the failure's class and reason as the server gave them
    assert got[3]["info"] == {"pid": 2}
    assert got[0]["result"]["echo"] is got[3]["result"]["echo"]
    assert 200_000 < sent < 201_000  # the shared lines once, the other host's once


def test_an_answer_that_does_not_decode_fails_its_host_alone() -> None:
    good = RawResult(_encode({"a": 1}, 3), len(b'{"id": 3, "ok": true, "result": '), 3)
    bad = RawResult(b'{"id": 4, "ok": true, "result": {"a": }', len(b'{"id": 4, "ok": true, "result": '), 4)
    liar = RawResult(b'{"id": 5, "ok": true, "result": 1, "id": 6}', len(b'{"id": 5, "ok": true, "result": '), 5)
    got, _ = _exchange([{"ok": True, "info": None, "result": r} for r in (bad, liar, good)], share=True)
    assert [g["ok"] for g in got] == [False, False, True] and got[2]["result"] == {"a": 1}
    assert {g["error"]["class"] for g in got[:2]} == {"AgentError"}


def test_only_modules_whose_readers_never_change_a_result_are_shared() -> None:
    assert mux_answers.shareable({"op": "call", "module": "source"})
    assert not mux_answers.shareable({"op": "call", "module": "service_host"})  # status pops keys from it
    assert not mux_answers.shareable({"op": "sequence", "steps": []})
