"""Kept connections batch every read-only command: one frame to the server per round of requests,
and every command's ``--json`` answer the same as over fresh connections (lab, real sshd)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli
from gpu_fixtures import FAKE_SMI, lab2_remapping_pending
from lab_support import LabHandle
from sglang_support import ML_VENV

from fleetctl.drift import audit as drift_audit
from fleetctl.errors import RemoteOperationError
from fleetctl.facts import collect_facts
from fleetctl.inventory import load_inventory
from fleetctl.transport import mux, mux_calls
from fleetctl.transport.base import Step
from fleetctl.transport.fleet import Fleet, RunSettings

pytestmark = pytest.mark.lab
SMI = ("-e", f"nvidia_smi={FAKE_SMI}", "-e", "gpus_expected=1", "-e", "gpu_model=H200")
# Fields that measure time (or the caches' age), never what a host answered.
TIMING = re.compile(r"(_ms|_s|seconds|elapsed|duration|age)$")
# What moves between any two runs, fresh or kept alike: free disk, available memory, a temporary path.
# ``cached_files`` too: the grep cache trusts no file whose ctime moved in the last seconds, so how many
# files it answered from depends on when the run came (the hits it found do not).
GAUGES = ("free", "memory_available", "script_path", "cached_files")



@pytest.fixture(scope="module")
def smi_lab(sglang_lab: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabHandle]:
    """The sglang lab; lab2's fake nvidia-smi reports a row remapping pending (a red host)."""
    with lab2_remapping_pending(sglang_lab, tmp_path_factory.mktemp("fake-smi")):
        yield sglang_lab


def _untimed(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _untimed(v) for k, v in doc.items() if not TIMING.search(str(k)) and k not in GAUGES}
    if isinstance(doc, list):
        return [_untimed(v) for v in doc]
    return doc


def _differences(a: Any, b: Any, at: str = "") -> list[str]:
    """Where two answers differ, as paths (the assertion's message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _differences(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{at}[{i}]")]
    return [] if a == b else [f"{at}: {a!r} != {b!r}"[:300]]


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "probe.py"
    script.write_text("import json, os, socket, sys\n"
                      "print(json.dumps({'host': socket.gethostname(), 'python': sys.version_info[:2],"
                      " 'venv': os.path.exists('/root/ml-env/bin/python')}))\n")
    return script


COMMANDS: dict[str, tuple[str, ...]] = {
    "facts": ("facts", "--venv", ML_VENV),
    "drift": ("drift", "--venv", ML_VENV, "--skip", "unsatisfied"),
    "probe grep": ("probe", "grep", "update_mamba_state_after_mtp_verify", "DFLASH", "--package", "sglang",
                   "--subpath", "srt", "--venv", ML_VENV),
    "probe symbol": ("probe", "symbol", "SpeculativeAlgorithm.DFLASH", "--venv", ML_VENV),
    "probe import": ("probe", "import", "sglang.version", "--venv", ML_VENV),
    "probe http": ("probe", "http", "/health", "--port", "9"),
    "gpu health": ("gpu", "health"),
}


@pytest.mark.parametrize("command", [*COMMANDS, "probe script"])
def test_kept_connections_answer_as_fresh_ones(smi_lab: LabHandle, mux_dir: Path, tmp_path: Path, command: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    args = COMMANDS.get(command) or ("probe", "script", str(_script(tmp_path)))
    base = ("-i", str(smi_lab.inventory_path), *SMI, "-l", "all")
    run_cli(capsys, *base, *args, "--json")  # host caches (the grep cache) warm for every run compared
    fresh = run_cli(capsys, *base, *args, "--json")
    opened = run_cli(capsys, *base, "--persist", "60", *args, "--json")  # the server connects every host
    kept = run_cli(capsys, *base, "--persist", "60", *args, "--json")  # every host on its kept connection
    assert [r.rc for r in (opened, kept)] == [fresh.rc] * 2, (fresh.err, opened.err, kept.err)
    assert fresh.rc in (0, 1), fresh.out + fresh.err  # an answer from every host, good or bad
    listed = mux.server_status(mux.socket_path(mux_dir)) or []
    assert sorted(c["host"] for c in listed) == sorted(smi_lab.hosts)  # the kept path was taken
    for run in (opened, kept):
        assert _differences(_untimed(run.json()), _untimed(fresh.json())) == []


def test_each_round_of_requests_is_one_frame_for_the_whole_fleet(sglang_lab: LabHandle, mux_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # No early flush of a round on a machine so busy that a host thread takes 5 s to ask: the count is exact.
    monkeypatch.setattr(mux_calls, "STALL_S", 600.0)
    inv = load_inventory(sglang_lab.inventory_path, {"nvidia_smi": FAKE_SMI})
    with Fleet(inv, inv.select("all"), RunSettings(persist=60)) as fleet:
        facts = fleet.map(lambda ctx: collect_facts(ctx, ML_VENV))
        assert all(r.ok for r in facts.values()), {h: r.reason for h, r in facts.items()}
        assert fleet.kept_frames == 2  # every host's facts, then every host's venv packages
        echo = fleet.map(lambda ctx: ctx.call("selftest", {"action": "echo"}))
        assert fleet.kept_frames == 3 and len({r.value["pid"] for r in echo.values() if r.value}) == 3
        steps = [Step("selftest", {"action": "echo"}), Step("selftest", {"action": "raise", "message": "no"})]
        seq = fleet.map(lambda ctx: ctx.sequence(steps))
        assert fleet.kept_frames == 4
    for host, res in seq.items():  # one agent per host, the same one as the pass before; the failure its own
        assert res.value is not None and res.value[0]["pid"] == echo[host].value["pid"]
        assert isinstance(res.value[1], RemoteOperationError) and res.value[1].host == host
    assert {h: r.value.venv.packages["sglang"] for h, r in facts.items() if r.value and r.value.venv} == {
        "lab1": "0.5.23", "lab2": "0.5.9", "lab3": "0.5.23"}


def test_drift_asks_each_host_in_two_rounds(sglang_lab: LabHandle, mux_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The venv's distributions, then the GPU stack and the serving release's models as one sequence:
    two frames for the fleet and two agent round trips per host (issue 37), with the answers of
    three plain calls (test_kept_connections_answer_as_fresh_ones compares them with fresh ones)."""
    monkeypatch.setattr(mux_calls, "STALL_S", 600.0)
    inv = load_inventory(sglang_lab.inventory_path, {"nvidia_smi": FAKE_SMI})
    with Fleet(inv, inv.select("all"), RunSettings(persist=60)) as fleet:
        found = fleet.map(lambda ctx: drift_audit.collect(ctx, ML_VENV, False))
        assert fleet.kept_frames == 2
    assert {h: r.value.version("sglang") for h, r in found.items() if r.value} == {
        "lab1": "0.5.23", "lab2": "0.5.9", "lab3": "0.5.23"}
    assert all(r.value and "nvidia-driver" in r.value.stack for r in found.values()), found


def test_a_server_that_dies_between_rounds_fails_each_host_and_the_pass_ends(sglang_lab: LabHandle,
                                                                            mux_dir: Path) -> None:
    inv = load_inventory(sglang_lab.inventory_path)

    def two_rounds(ctx: Any) -> Any:
        ctx.call("selftest", {"action": "echo"})
        for pid_file in mux_dir.glob("*.pid"):  # every host gets here before the second round goes out
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        return ctx.call("selftest", {"action": "echo"})

    with Fleet(inv, inv.select("all"), RunSettings(persist=60)) as fleet:
        results = fleet.map(two_rounds)
    assert {h: r.status for h, r in results.items()} == dict.fromkeys(sglang_lab.hosts, "failed")
    # killed (as the out-of-memory killer would): the reason says the process is gone, and where its log is
    pid = next(mux_dir.glob("*.pid")).read_text().strip()
    assert all(f"persistent-connection server (pid {pid}) ended during this command" in r.reason
               and str(mux_dir) in r.reason for r in results.values()), results


def test_host_functions_that_wait_on_each_other_still_finish(sglang_lab: LabHandle, mux_dir: Path) -> None:
    """One host's function holds a lock while its request waits for the frame; the other's waits
    for that lock, so it never asks: the request goes alone (after mux_calls.STALL_S), not never."""
    inv = load_inventory(sglang_lab.inventory_path)
    lock = threading.Lock()

    def one_at_a_time(ctx: Any) -> Any:
        with lock:
            return ctx.call("selftest", {"action": "echo"})["pid"]

    with Fleet(inv, inv.select("lab1,lab2"), RunSettings(persist=60)) as fleet:
        results = fleet.map(one_at_a_time)
        assert fleet.kept_frames == 2  # one host's request per frame
    assert all(r.ok for r in results.values()), results


def _frames_seen(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every message this process reads from the connection server (a frame's answers among them)."""
    seen: list[dict[str, Any]] = []
    real = mux.recv_frame

    def recording(sock: Any) -> Any:
        got = real(sock)
        if isinstance(got, dict):
            seen.append(got)
        return got

    monkeypatch.setattr(mux, "recv_frame", recording)
    return seen


def test_kept_probe_grep_sends_the_lines_hosts_share_once_and_answers_as_fresh(
        sglang_lab: LabHandle, mux_dir: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """lab1 and lab3 hold the same sglang: their matched lines cross from the server once (a
    reference for the second, beside its own timing); lab2's differ and cross whole. The answer is
    the fresh one."""
    base = ("-i", str(sglang_lab.inventory_path), "-l", "all")
    args = (*COMMANDS["probe grep"], "--json")
    run_cli(capsys, *base, *args)  # host caches (the grep cache) warm for every run compared
    fresh = run_cli(capsys, *base, *args)
    run_cli(capsys, *base, "--persist", "60", *args)  # the server connects every host
    seen = _frames_seen(monkeypatch)
    kept = run_cli(capsys, *base, "--persist", "60", *args)
    assert kept.rc == fresh.rc == 0, (fresh.err, kept.err)
    assert _differences(_untimed(kept.json()), _untimed(fresh.json())) == []
    answers = [m for m in seen if "raw" in m]  # the grep's: passed through the server undecoded
    assert len(answers) == 3, seen
    shared = [m for m in answers if m.get("refs")]
    assert len(shared) == 1 and all(host in (0, 1, 2) and host != answers.index(shared[0])
                                    for _, host, _ in shared[0]["refs"]), answers
    values = {h: kept.json()["hosts"][h]["value"] for h in ("lab1", "lab3")}
    assert values["lab1"]["files"] == values["lab3"]["files"] and values["lab1"]["matched_lines"] > 0


def test_hosts_that_answer_alike_share_one_answer_and_a_failure_mid_pass_keeps_its_class(
        sglang_lab: LabHandle, mux_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two rounds: every host's venv packages (lab1 and lab3 alike, lab2 other); then lab2's agent
    dies while lab1 and lab3 ask again. As over fresh connections, host by host, error class too;
    what lab1 and lab3 answered alike crossed once and is one object."""
    monkeypatch.setattr(mux_calls, "STALL_S", 600.0)
    python = f"{ML_VENV}/bin/python"

    def two_rounds(ctx: Any) -> Any:
        first = ctx.call("venv_packages", {}, python=python)
        if ctx.name == "lab2":
            return ctx.call("selftest", {"action": "die"})
        return first, ctx.call("venv_packages", {}, python=python)

    inv = load_inventory(sglang_lab.inventory_path)
    with Fleet(inv, inv.select("all"), RunSettings()) as fleet:
        fresh = fleet.map(two_rounds)
    seen = _frames_seen(monkeypatch)
    with Fleet(inv, inv.select("all"), RunSettings(persist=60)) as fleet:
        kept = fleet.map(two_rounds)
        assert fleet.kept_frames == 2
    assert {h: (r.status, r.details.get("error")) for h, r in kept.items()} == {
        h: (r.status, r.details.get("error")) for h, r in fresh.items()}
    assert kept["lab2"].details.get("error") == "AgentError", kept["lab2"]
    for host in ("lab1", "lab3"):
        assert kept[host].value == fresh[host].value
    one, three = kept["lab1"].value, kept["lab3"].value
    assert one is not None and three is not None and one[0] is three[0] and one[1] is three[1]
    assert one[0]["packages"]["sglang"] == "0.5.23"
    answers = [m for m in seen if "raw" in m]
    assert len(answers) == 5 and len([m for m in answers if "same" in m]) == 2, answers
