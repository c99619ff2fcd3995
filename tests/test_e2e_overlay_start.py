"""``venv overlay`` on the lab fleet: when the file streams start (issue 37: a fresh overlay against
``ssh src tar | ssh dst tar``, which starts moving bytes at once)."""

from __future__ import annotations

import hashlib
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


def _watched(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """What the overlay asks of each host, in order: the target's listings, the source's file lists,
    each bulk stream started (the real calls, recorded on the way)."""
    events: list[tuple[str, str]] = []
    real_stream, real_call, real_complete = (overlay_stream.bulk_stream, overlay_run.target_call,
                                             overlay_run.SourceFiles.complete)

    def bulk_stream(connector: Any, command: str) -> Any:
        events.append(("stream", connector.host))
        return real_stream(connector, command)

    def target_call(session: Any, req: Any, params: dict[str, Any]) -> Any:
        events.append(("list files" if params.get("names") is not None else params["action"], session.name))
        return real_call(session, req, params)

    def complete(self: Any, names: set[str]) -> Any:
        events.append(("source file lists", self.session.name))
        return real_complete(self, names)

    monkeypatch.setattr(overlay_stream, "bulk_stream", bulk_stream)
    monkeypatch.setattr(overlay_run, "target_call", target_call)
    monkeypatch.setattr(overlay_run.SourceFiles, "complete", complete)
    return events


def _digests(lab: LabHandle, host: str, venv: str) -> str:
    return lab.ssh(host, f"cd {venv}/lib/python3.11/site-packages && find . -name __pycache__ -prune "
                         "-o -type f ! -name RECORD -print0 | sort -z | xargs -0 sha256sum").stdout


def test_a_fresh_targets_streams_start_before_its_plan_and_a_rerun_starts_none(
    lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target whose own tree hashes already differ from the source's gets its stream (and the
    source its stream) started before the source's file lists are fetched, so ssh connects and the
    remote python starts meanwhile; a target holding none of the distributions (and no overlay cut
    short) is not asked to list or hash its files: there is nothing to compare. The overlay lands
    whole. A re-run with nothing to change starts no stream at all."""
    make_venv(lab_fleet, "lab1", SRC, wheel_set("requests==2.32.3"))
    lab_fleet.ssh("lab2", f"rm -rf {shlex.quote(DST)} && /usr/bin/python3 -m venv --without-pip {shlex.quote(DST)}")
    events = _watched(monkeypatch)
    args = ("-i", str(lab_fleet.inventory_path), "-l", "lab2", "venv", "overlay", "--from", "lab1", "--venv", SRC,
            "--to-venv", DST, "--json")
    r = run_cli(capsys, *args)
    assert r.rc == 0, r.out[-2000:] + r.err
    assert r.json()["hosts"]["lab2"]["value"]["applied"]["written"] > 50
    lists = events.index(("source file lists", "lab1"))
    assert events.index(("stream", "lab2")) < lists and events.index(("stream", "lab1")) < lists, events
    assert [e for e in events if e[1] == "lab2" and e[0] != "stream"] == [("list", "lab2")], events
    assert _digests(lab_fleet, "lab2", DST) == _digests(lab_fleet, "lab1", SRC)
    events.clear()
    again = run_cli(capsys, *args)
    assert again.rc == 0 and again.json()["line"] == "1 targets: 0 changed, 1 nothing to change", again.out[-2000:]
    assert [e for e in events if e[0] == "stream"] == [], events


def test_a_target_with_an_overlay_cut_short_is_compared_file_by_file(
    lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A venv whose last overlay was cut short (its journal left) holds files of a distribution
    whose dist-info was never written: those are hashed and only the missing or different ones
    sent, as a re-run completing the overlay does."""
    make_venv(lab_fleet, "lab1", SRC, wheel_set("requests==2.32.3"))
    q = shlex.quote(DST)
    lab_fleet.ssh("lab2", f"rm -rf {q} && /usr/bin/python3 -m venv --without-pip {q}")
    args = ("-i", str(lab_fleet.inventory_path), "-l", "lab2", "venv", "overlay", "--from", "lab1", "--venv", SRC,
            "--to-venv", DST, "--packages", "idna", "--json")
    assert run_cli(capsys, *args).rc == 0
    # what a cut overlay leaves: the files, no dist-info, the journal
    key = hashlib.sha256(DST.encode()).hexdigest()[:16]
    lab_fleet.ssh("lab2", f"rm -rf {q}/lib/python3.11/site-packages/idna-*.dist-info && "
                          f"echo '{{\"temps\": []}}' > /var/lib/fleetctl/overlays/inflight-{key}.json")
    events = _watched(monkeypatch)
    r = run_cli(capsys, *args)
    assert r.rc == 0, r.out[-2000:] + r.err
    (idna,) = r.json()["hosts"]["lab2"]["value"]["dists"]
    assert ("hashes", "lab2") in events and idna["unchanged"] >= 5 and 0 < idna["send"] <= 8, (events, idna)
    assert lab_fleet.ssh("lab2", f"ls /var/lib/fleetctl/overlays/inflight-{key}.json", check=False).returncode != 0
