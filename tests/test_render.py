"""Rendering: gathered values, JSON envelopes, and host output never read as markup."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fleetctl.adhoc import gather
from fleetctl.render import emit_json, gathered, results_json
from fleetctl.transport.base import CommandResult, HostResult, Status


def test_gathered_shows_a_shared_value_once() -> None:
    assert gathered({"a": "3.11", "b": "3.11"}) == "3.11"
    assert gathered({"a": "x", "b": "y", "c": "y"}) == "b,c: y\na: x"


def test_gather_groups_hosts_by_identical_output() -> None:
    def ok(out: str) -> CommandResult:
        return CommandResult("c", 0, out, "")

    results = {
        "h1": HostResult("h1", Status.OK, ok("same\n")),
        "h2": HostResult("h2", Status.OK, ok("same\n")),
        "h3": HostResult("h3", Status.OK, ok("other\n")),
        "h4": HostResult("h4", Status.UNREACHABLE, reason="cannot connect"),
    }
    blocks = gather(results)
    assert [(b.hosts, b.stdout, b.status) for b in blocks] == [
        (("h1", "h2"), "same\n", "ok"), (("h3",), "other\n", "ok"), (("h4",), "", "unreachable")]
    assert blocks[-1].stderr == "cannot connect"


def test_results_json_keeps_failures_and_drops_tracebacks() -> None:
    results = {
        "a": HostResult("a", Status.OK, value=1),
        "b": HostResult("b", Status.FAILED, reason="boom", details={"rc": 2, "traceback": "secret frames"}),
    }
    doc = results_json(results, lambda v: v * 10)
    assert doc == {"hosts": {"a": {"status": "ok", "value": 10},
                             "b": {"status": "failed", "reason": "boom", "rc": 2}},
                   "summary": {"ok": 1, "failed": 1, "unreachable": 0}}


def test_host_output_is_not_rich_markup(capsys) -> None:  # type: ignore[no-untyped-def]
    from fleetctl.render import print_blocks

    block = gather({"h": HostResult("h", Status.OK, CommandResult("c", 0, "[bold]x[/bold] [red]", ""))})
    print_blocks(block)
    assert "[bold]x[/bold] [red]" in capsys.readouterr().out


def test_json_output_is_indented_to_each_host_entry_and_reads_back_whole(capsys: pytest.CaptureFixture[str],
                                                                          tmp_path: Path) -> None:
    """--json: the same document json.dumps writes, indented down to each host's entry (one line per
    field there), every value below on one line; keys json converts (ints), tuples, paths as json does."""
    value = {"files": [{"path": "sglang/srt/a.py", "hits": [{"line": 3, "terms": ("Mamba",)}]}],
             "by_line": {3: "x"}, "where": tmp_path, "empty": {}}
    doc = {"hosts": {"lab1": {"status": "ok", "value": value}, "lab2": {"status": "failed", "reason": "r"}},
           "summary": {"ok": 1, "failed": 1}, "matrix": []}
    emit_json(doc)
    out = capsys.readouterr().out
    assert json.loads(out) == json.loads(json.dumps(doc, default=str))
    lines = out.splitlines()
    assert lines[:4] == ["{", '  "hosts": {', '    "lab1": {', '      "status": "ok",']
    assert lines[4] == '      "value": ' + json.dumps(value, default=str)
    assert '  "matrix": []' in lines and lines[-1] == "}"


def test_json_output_is_written_host_by_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thousand hosts' --json is never one string in memory: no single write holds more than one
    host's entry (the text is the same, piece by piece)."""
    writes: list[str] = []

    class Recorder:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

    value = {"files": [{"path": f"sglang/srt/m{i}.py", "lines": ["x" * 80] * 50} for i in range(20)]}
    doc = {"hosts": {f"lab{i}": {"status": "ok", "value": value} for i in range(50)}, "summary": {"ok": 50}}
    monkeypatch.setattr(sys, "stdout", Recorder())
    emit_json(doc)
    one_host = len(json.dumps(value))
    assert max(len(w) for w in writes) <= one_host + 100
    assert json.loads("".join(writes)) == doc
