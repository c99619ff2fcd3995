"""``venv overlay`` on the lab fleet: how each host is asked and when the file streams start (issue 37:
a fresh overlay against ``ssh src tar | ssh dst tar``, which starts moving bytes at once)."""

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
from fleetctl.transport.agent import module_source
from fleetctl.transport.fleet import HostContext

pytestmark = pytest.mark.lab
SRC, DST = "/root/ovs-src", "/root/ovs-dst"


def _watched(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """What the overlay asks of each host, in order: the target's listings, the source's file lists,
    each bulk stream started, each agent call (the real ones, recorded on the way)."""
    events: list[tuple[str, str]] = []
    real_stream, real_call, real_complete = (overlay_stream.bulk_stream, overlay_run.target_call,
                                             overlay_run.SourceFiles.complete)
    real_agent = HostContext.call

    def bulk_stream(connector: Any, command: str) -> Any:
        events.append(("stream", connector.host))
        return real_stream(connector, command)

    def target_call(calls: Any, req: Any, params: dict[str, Any]) -> Any:
        events.append(("list files" if params.get("names") is not None else params["action"], calls.name))
        return real_call(calls, req, params)

    def complete(self: Any, names: set[str]) -> Any:
        events.append(("source file lists", self.calls.name))
        return real_complete(self, names)

    def agent_call(self: Any, module: str, *args: Any, **kwargs: Any) -> Any:
        events.append(("agent " + module, self.name))
        return real_agent(self, module, *args, **kwargs)

    monkeypatch.setattr(overlay_stream, "bulk_stream", bulk_stream)
    monkeypatch.setattr(overlay_run, "target_call", target_call)
    monkeypatch.setattr(overlay_run.SourceFiles, "complete", complete)
    monkeypatch.setattr(HostContext, "call", agent_call)
    return events


def _digests(lab: LabHandle, host: str, venv: str) -> str:
    return lab.ssh(host, f"cd {venv}/lib/python3.11/site-packages && find . -name __pycache__ -prune "
                         "-o -type f ! -name RECORD -print0 | sort -z | xargs -0 sha256sum").stdout


def test_a_fresh_overlay_lists_each_host_over_the_process_that_then_carries_its_files(
    lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each host's stream process starts with the command and answers its listings (the source's
    file lists from what it described for the listing), then the target takes its plan and the
    source sends: one ssh connection per host, no agent started on either. A target holding none
    of the distributions (and no overlay cut short) is not asked to list or hash its files. The
    overlay lands whole; each process's compiled code is kept on its host for the next start. A
    re-run with nothing to change asks the same two processes, sends nothing, and still starts no
    agent."""
    make_venv(lab_fleet, "lab1", SRC, wheel_set("requests==2.32.3"))
    lab_fleet.ssh("lab2", f"rm -rf {shlex.quote(DST)} && /usr/bin/python3 -m venv --without-pip {shlex.quote(DST)}")
    events = _watched(monkeypatch)
    args = ("-i", str(lab_fleet.inventory_path), "-l", "lab2", "venv", "overlay", "--from", "lab1", "--venv", SRC,
            "--to-venv", DST, "--json")
    r = run_cli(capsys, *args)
    assert r.rc == 0, r.out[-2000:] + r.err
    assert r.json()["hosts"]["lab2"]["value"]["applied"]["written"] > 50
    assert sorted(e for e in events if e[0] == "stream") == [("stream", "lab1"), ("stream", "lab2")], events
    assert [e for e in events if e[0].startswith("agent")] == [], events
    assert [e for e in events if e[1] == "lab2" and e[0] != "stream"] == [("list", "lab2")], events
    assert ("source file lists", "lab1") in events
    assert _digests(lab_fleet, "lab2", DST) == _digests(lab_fleet, "lab1", SRC)
    for host, module in (("lab1", "overlay_source"), ("lab2", "overlay_target")):  # compiled once, kept
        code = f"/var/lib/fleetctl/cache/code/agent-{module_source(module)[1]}-cpython-311.code"
        assert lab_fleet.ssh(host, f"test -s {code}", check=False).returncode == 0, (host, code)
    events.clear()
    again = run_cli(capsys, *args)
    assert again.rc == 0 and again.json()["line"] == "1 targets: 0 changed, 1 nothing to change", again.out[-2000:]
    assert sorted(e for e in events if e[0] == "stream") == [("stream", "lab1"), ("stream", "lab2")], events
    assert [e for e in events if e[0].startswith("agent") or e[0] == "source file lists"] == [], events


def test_a_missing_venv_on_either_side_is_one_line(lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    """The stream process's python absent: the source's is a usage error naming the venv, a
    target's fails that host, saying how to make it."""
    make_venv(lab_fleet, "lab1", SRC, wheel_set("requests==2.32.3"))
    lab_fleet.ssh("lab2", f"rm -rf {shlex.quote(DST)}")
    base = ("-i", str(lab_fleet.inventory_path), "-l", "lab2", "venv", "overlay", "--from", "lab1")
    no_source = run_cli(capsys, *base, "--venv", "/root/no-such-venv", "--to-venv", DST)
    assert no_source.rc == 3 and "--from lab1: no venv at /root/no-such-venv" in no_source.err, no_source.err
    no_target = run_cli(capsys, *base, "--venv", SRC, "--to-venv", DST, "--json")
    assert no_target.rc == 2, no_target.out[-2000:]
    assert no_target.json()["hosts"]["lab2"]["reason"] == f"no venv at {DST} (create it: fleetctl venv create)"


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


def test_an_unreachable_source_is_one_line(lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    """The source's process cannot connect: the command says so in one line (its own error), never an
    internal error from the source's calls being looked up before its listing was waited for."""
    import yaml

    doc = yaml.safe_load(lab_fleet.inventory_path.read_text())
    doc["all"]["children"]["lab"]["hosts"]["lab1"]["ansible_port"] = 1  # nothing listens there
    inventory = lab_fleet.dir / "inventory-ovs-unreachable.yml"  # beside the lab's known_hosts
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        r = run_cli(capsys, "-i", str(inventory), "-l", "lab2", "venv", "overlay", "--from", "lab1",
                    "--venv", SRC, "--to-venv", DST)
    finally:
        inventory.unlink()
    assert r.rc == 2, r.out + r.err
    assert r.err.strip().splitlines() == [
        f"fleetctl: error: lab1: ssh: connect to host {lab_fleet.addresses['lab1']} port 1: Connection refused"], r.err
