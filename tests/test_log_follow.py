"""The follower behind ``logs --follow`` as real local processes (no SSH): its lines carry their
instance, secrets are masked, a source that ends is a note and the stream's end an ``ended`` event,
and a stop leaves no ``tail`` behind."""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path

from fleetctl.release.log_follow import FollowEvent, HostReader, stop
from fleetctl.transport.agent import stream_command
from fleetctl.transport.local import LocalConnector


def start(sources: list[dict], secrets: list[str]) -> tuple[HostReader, queue.Queue[FollowEvent]]:
    stream = LocalConnector("local").open_stream(stream_command("log_follow", ["/usr/bin/python3"],
                                                                {"sources": sources}))
    events: queue.Queue[FollowEvent] = queue.Queue()
    reader = HostReader("local", stream, secrets, events)
    reader.start()
    return reader, events


def next_event(events: queue.Queue[FollowEvent]) -> FollowEvent:
    return events.get(timeout=30)


def tails_of(path: Path) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"tail") and str(path).encode() in argv:
            found.append(int(pid))
    return found


def test_lines_carry_their_instance_secrets_are_masked_and_a_stop_ends_tail(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("old line\n")
    reader, events = start([{"label": "a", "argv": ["tail", "-F", "-n", "1", str(log)]}], ["s3cret"])
    assert next_event(events) == FollowEvent("line", "local", "old line", "a")
    with log.open("a") as handle:
        handle.write("token=s3cret here\n")
    assert next_event(events) == FollowEvent("line", "local", "token=******** here", "a")
    assert tails_of(log)
    stop([reader])
    assert next_event(events) == FollowEvent("ended", "local", "stopped")
    deadline = time.monotonic() + 10
    while tails_of(log) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tails_of(log) == []


def test_sources_that_end_are_notes_then_the_stream_ends(tmp_path: Path) -> None:
    reader, events = start([{"label": None, "argv": ["/bin/echo", "only line"]},
                            {"label": None, "argv": [str(tmp_path / "no-such-tool")]}], [])
    got = {next_event(events) for _ in range(3)}
    assert got == {FollowEvent("line", "local", "only line"), FollowEvent("note", "local", "/bin/echo ended"),
                   FollowEvent("note", "local", f"cannot run {tmp_path}/no-such-tool: No such file or directory")}
    assert next_event(events) == FollowEvent("ended", "local", "stream ended")
    reader.join(10)
