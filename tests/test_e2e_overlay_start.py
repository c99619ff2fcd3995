"""``venv overlay`` on the lab fleet: when the file streams start (issue 37: a fresh overlay against
``ssh src tar | ssh dst tar``, which starts moving bytes at once)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from sglang_support import make_venv, wheel_set

from fleetctl.overlay import run as overlay_run
from fleetctl.overlay import stream as overlay_stream

pytestmark = pytest.mark.lab
SRC, DST = "/root/ovs-src", "/root/ovs-dst"


def test_a_fresh_targets_streams_start_before_its_plan_and_a_rerun_starts_none(
    lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target whose own tree hashes already differ from the source's gets its stream (and the
    source its stream) started before the target's files are compared, so ssh connects and the
    remote python starts meanwhile; a target holding none of the distributions is not asked to list
    their files (its own listing said so); the overlay lands whole. A re-run with nothing to change
    starts no stream at all."""
    make_venv(lab_fleet, "lab1", SRC, wheel_set("requests==2.32.3"))
    lab_fleet.ssh("lab2", f"rm -rf {shlex.quote(DST)} && /usr/bin/python3 -m venv --without-pip {shlex.quote(DST)}")
    events: list[tuple[str, str]] = []
    real_stream, real_call = overlay_stream.bulk_stream, overlay_run.target_call

    def bulk_stream(connector: Any, command: str) -> Any:
        events.append(("stream", connector.host))
        return real_stream(connector, command)

    def target_call(session: Any, req: Any, params: dict[str, Any]) -> Any:
        events.append(("list files" if params.get("names") is not None else params["action"], session.name))
        return real_call(session, req, params)

    monkeypatch.setattr(overlay_stream, "bulk_stream", bulk_stream)
    monkeypatch.setattr(overlay_run, "target_call", target_call)
    args = ("-i", str(lab_fleet.inventory_path), "-l", "lab2", "venv", "overlay", "--from", "lab1", "--venv", SRC,
            "--to-venv", DST, "--json")
    r = run_cli(capsys, *args)
    assert r.rc == 0, r.out[-2000:] + r.err
    assert r.json()["hosts"]["lab2"]["value"]["applied"]["written"] > 50
    assert ("stream", "lab1") in events and ("stream", "lab2") in events, events
    assert events.index(("stream", "lab2")) < events.index(("hashes", "lab2")), events
    assert events.index(("stream", "lab1")) < events.index(("hashes", "lab2")), events
    assert ("list files", "lab2") not in events, events  # it has none of the distributions: nothing to list
    def digests(host: str, venv: str) -> str:
        return lab_fleet.ssh(host, f"cd {venv}/lib/python3.11/site-packages && find . -name __pycache__ -prune "
                                   "-o -type f ! -name RECORD -print0 | sort -z | xargs -0 sha256sum").stdout

    assert digests("lab2", DST) == digests("lab1", SRC)
    events.clear()
    again = run_cli(capsys, *args)
    assert again.rc == 0 and again.json()["line"] == "1 targets: 0 changed, 1 nothing to change", again.out[-2000:]
    assert [e for e in events if e[0] == "stream"] == [], events
