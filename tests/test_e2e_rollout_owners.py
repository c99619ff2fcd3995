"""A rollout owns its hosts for its whole life (issue 32, defect 6): two operators on overlapping hosts
never silently undo each other. A second deploy on a host a rollout holds is refused in one line naming
the holder (or waits with --wait); two rollouts racing for a host end as "B refused" or "A halted on that
host", whatever their start offsets; a resumed rollout halts a host changed behind it; prune keeps the
rollout's rollback target. Each ends with the whole-host check: what each host serves, its history, the
journal's verdict.

The rollouts wait at a barrier (``wait_for`` a file the test creates) after their deploy: the test
decides when a run may end, so no outcome depends on how fast this machine is.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import run_cli
from lab_support import LabHandle
from reliability_support import assert_whole, release_state, tiny_releases, wait_until

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
GO = "/root/go-{}"  # a rollout's barrier: it goes on once the test creates this file on the host


def rollout_book(folder: Path, name: str, spec: Path, hosts: str, barrier: str | None = None,
                 **play: Any) -> Path:
    """A canary-first rollout of ``spec``; with ``barrier``, each host waits for GO after its deploy."""
    tasks: list[dict[str, Any]] = [{"name": "deploy", "release": str(spec)}]
    if barrier:
        tasks.append({"name": "barrier", "wait_for": {"path": GO.format(barrier), "timeout": 600}})
    path = folder / f"{name}.yml"
    path.write_text(yaml.safe_dump([{"name": name, "hosts": hosts, "serial": 1, "on_failure": "halt", **play,
                                     "tasks": tasks}], sort_keys=False))
    return path


def start(lab: LabHandle, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fleetctl.cli.main", "-i", str(lab.inventory_path), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, Any, str]:
    """Exit code, the --json document (None when there is none) and stderr of a finished command."""
    out, err = proc.communicate(timeout=600)
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    return proc.returncode, doc, out + err


def journal(lab: LabHandle, book: Path) -> list[dict[str, Any]]:
    """The events of the run of ``book`` ([] before it has started)."""
    for path in (lab.dir / ".fleetctl" / "runs").glob("*.jsonl"):
        events = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
        if events and Path(str(events[0].get("playbook"))).name == book.name:
            return events
    return []


def waiting_or_done(lab: LabHandle, book: Path, proc: subprocess.Popen[str]) -> bool:
    """The run ended, or it reached its barrier (took its hosts, deployed one)."""
    return proc.poll() is not None or any(e.get("event") == "task_start" and e.get("name") == "barrier"
                                          for e in journal(lab, book))


def history(lab: LabHandle, host: str) -> list[dict[str, Any]]:
    out = lab.ssh(host, "cat /var/lib/fleetctl/state.json 2>/dev/null || echo '{}'").stdout
    return list(json.loads(out).get("history") or [])


def release_go(lab: LabHandle, *barriers: str) -> None:
    for host in lab.hosts:
        lab.ssh(host, " && ".join(f"touch {GO.format(b)}" for b in barriers))


def host_results(doc: Any, host: str) -> list[dict[str, Any]]:
    return list((doc or {}).get("results", {}).get(host) or [])


def test_a_deploy_on_a_host_a_rollout_owns_is_refused_naming_it_or_waits(
        scratch_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The review's run 2: during A's canary, B deploys a hotfix on a host of A's later batch. Before,
    B said ok and A's next batch replaced the hotfix with no message. Now B is refused in one line
    naming A (who, command, since when, run id); with --wait B deploys after A's run has ended."""
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    base, ours, hotfix = tiny_releases(lab, tmp_path, ["base", "rollout", "hotfix"])
    rid = {p.stem: load_spec(p).release_id for p in (base, ours, hotfix)}
    assert run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(base)).rc == 0
    book = rollout_book(tmp_path, "rollout-a", ours, "lab", barrier="a")
    a = start(lab, "run", str(book), "--json")
    waiting: subprocess.Popen[str] | None = None
    try:
        wait_until(lambda: waiting_or_done(lab, book, a), "A's canary (lab1) deployed", timeout=300)
        assert a.poll() is None, finish(a)
        run_id = journal(lab, book)[0]["run_id"]
        b = run_cli(capsys, "-i", inv, "-l", "lab2", "deploy", str(hotfix), "--json")
        assert b.rc == 2, b.out + b.err
        reason = b.json()["hosts"]["lab2"]["reason"]
        assert reason.startswith(f"locked by another run: {os.environ.get('USER', 'root')}@"), reason
        assert f"(fleetctl run {book}) since " in reason and f", run {run_id}; --wait SECONDS" in reason, reason
        assert b.json()["hosts"]["lab2"].get("value") is None  # nothing done there
        # with --wait, B waits for A's run to end, then deploys
        waiting = start(lab, "-l", "lab2", "deploy", str(hotfix), "--wait", "300", "--json")
        release_go(lab, "a")
        a_rc, a_doc, a_out = finish(a)
        w_rc, w_doc, w_out = finish(waiting)
    finally:
        release_go(lab, "a")
        for proc in (a, waiting):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert a_rc == 0 and a_doc["status"] == "ok", a_out
    assert w_rc == 0 and w_doc["hosts"]["lab2"]["value"]["outcome"] == "deployed", w_out
    # whole-host check: what each host serves, its history, the journal's verdict
    assert_whole(lab, "lab1", rid["rollout"])
    assert_whole(lab, "lab2", rid["hotfix"])
    assert [h["to"] for h in history(lab, "lab1")] == [rid["base"], rid["rollout"]]
    # lab2: A's release, then B's hotfix deployed after A's run ended (never B's replaced by A)
    assert [h["to"] for h in history(lab, "lab2")] == [rid["base"], rid["rollout"], rid["hotfix"]]
    events = journal(lab, book)
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "ok"
    assert all(r["status"] != "failed" for h in ("lab1", "lab2") for r in host_results(a_doc, h))


def race_once(lab: LabHandle, folder: Path, capsys: pytest.CaptureFixture[str], trial: int, rng: random.Random,
              specs: dict[str, Path], rid: dict[str, str]) -> str:
    """A (lab1, lab2, canary first) and B (lab2) started at random offsets; both wait at a barrier the
    test lifts only once each has reached it or ended. Returns the outcome, checked whole."""
    assert run_cli(capsys, "-i", str(lab.inventory_path), "-l", "all", "deploy", str(specs["base"])).rc == 0
    for host in lab.hosts:
        lab.ssh(host, f"rm -f {GO.format('a')} {GO.format('b')}")
    before = {h: len(history(lab, h)) for h in lab.hosts}
    a_book = rollout_book(folder, f"a{trial}", specs["rollout"], "lab", barrier="a")
    b_book = rollout_book(folder, f"b{trial}", specs["hotfix"], "lab2", barrier="b")
    offsets = {"a": rng.uniform(0, 1.5), "b": rng.uniform(0, 1.5)}
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        t0 = time.monotonic()
        for who in sorted(offsets, key=offsets.__getitem__):
            time.sleep(max(0.0, t0 + offsets[who] - time.monotonic()))
            procs[who] = start(lab, "run", str(a_book if who == "a" else b_book), "--json")
        wait_until(lambda: waiting_or_done(lab, a_book, procs["a"]) and waiting_or_done(lab, b_book, procs["b"]),
                   f"trial {trial}: both runs at their barrier or ended", timeout=300)
        release_go(lab, "a", "b")
        (a_rc, a_doc, a_out), (b_rc, b_doc, b_out) = finish(procs["a"]), finish(procs["b"])
    finally:
        release_go(lab, "a", "b")
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    where = f"trial {trial} (offsets {offsets}):\nA: {a_out}\nB: {b_out}"
    switched = {h: [e["to"] for e in history(lab, h)[before[h]:]] for h in lab.hosts}
    # lab1 is A's alone; lab2 went to exactly one of them, never to one and then the other
    assert switched["lab1"] == [rid["rollout"]], where
    assert len(switched["lab2"]) == 1, f"lab2 switched {switched['lab2']}: a silent replacement; {where}"
    a_lab2 = host_results(a_doc, "lab2")
    if switched["lab2"] == [rid["rollout"]]:
        outcome = "B refused"
        assert (a_rc, a_doc["status"]) == (0, "ok") and b_rc == 2, where
        (refusal,) = host_results(b_doc, "lab2")
        assert refusal["status"] == "failed" and f"(fleetctl run {a_book}) since " in refusal["msg"], where
        assert f"run {a_doc['run_id']}" in refusal["msg"], where
    else:
        outcome = "A halted on that host"
        assert switched["lab2"] == [rid["hotfix"]] and (b_rc, b_doc["status"]) == (0, "ok"), where
        assert a_rc == 2 and [r["status"] for r in a_lab2] == ["failed"], where
        assert f"(fleetctl run {b_book}) since " in a_lab2[0]["msg"], where
        assert f"run {b_doc['run_id']}" in a_lab2[0]["msg"], where
    assert_whole(lab, "lab1", rid["rollout"])
    assert_whole(lab, "lab2", switched["lab2"][0])
    verdicts = {journal(lab, a_book)[-1]["status"], journal(lab, b_book)[-1]["status"]}
    assert verdicts == {"ok", "failed"}, where  # the refused run says so in its journal
    return outcome


def test_two_rollouts_racing_for_a_host_twenty_times(scratch_lab: LabHandle, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever the start offsets: "B refused" or "A halted on that host", never a silent replacement."""
    seed = int(os.environ.get("FLEETCTL_RACE_SEED") or random.SystemRandom().randrange(1 << 30))
    rng = random.Random(seed)
    specs = dict(zip(("base", "rollout", "hotfix"), tiny_releases(scratch_lab, tmp_path, ["base", "rollout",
                                                                                          "hotfix"]), strict=True))
    rid = {name: load_spec(path).release_id for name, path in specs.items()}
    outcomes = []
    for trial in range(20):
        try:
            outcomes.append(race_once(scratch_lab, tmp_path, capsys, trial, rng, specs, rid))
        except AssertionError as exc:
            raise AssertionError(f"race seed {seed} (FLEETCTL_RACE_SEED={seed} repeats it): {exc}") from None
    print(f"race seed {seed}: {outcomes}")
    assert set(outcomes) <= {"B refused", "A halted on that host"}


def test_resumed_rollout_halts_a_host_changed_behind_it(scratch_lab: LabHandle, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A halts after its canary; B deploys a hotfix on lab2 (A's lock ended with its run); A resumed
    does not switch lab2 over B's hotfix: it halts there in one line naming B's switch."""
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    specs = dict(zip(("base", "rollout", "hotfix"), tiny_releases(lab, tmp_path, ["base", "rollout", "hotfix"]),
                     strict=True))
    rid = {name: load_spec(path).release_id for name, path in specs.items()}
    assert run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(specs["base"])).rc == 0
    # A's canary passes its deploy, then a check fails on lab1 until the operator mends it: A halts
    book = tmp_path / "rollout-a.yml"
    book.write_text(yaml.safe_dump([{"name": "rollout-a", "hosts": "lab", "serial": 1, "on_failure": "halt",
                                     "tasks": [{"name": "deploy", "release": str(specs["rollout"])},
                                               {"name": "mended", "command": "test -e /root/mended"}]}]))
    first = run_cli(capsys, "-i", inv, "run", str(book), "--json")
    assert first.rc == 2 and first.json()["status"] == "halted", first.out + first.err
    run_id = first.json()["run_id"]
    hotfix = run_cli(capsys, "-i", inv, "-l", "lab2", "deploy", str(specs["hotfix"]), "--json")
    assert hotfix.rc == 0, hotfix.out + hotfix.err
    lab.ssh("lab1", "touch /root/mended")
    resumed = run_cli(capsys, "-i", inv, "run", str(book), "--resume", run_id, "--json")
    assert resumed.rc == 2, resumed.out + resumed.err
    (lab2,) = [r for r in resumed.json()["results"]["lab2"] if r["name"] == "deploy"]
    assert lab2["status"] == "failed", lab2
    assert lab2["msg"].startswith(f"runs {rid['hotfix']}, not {rid['base']} as this rollout recorded (switched by "), \
        lab2["msg"]
    assert lab2["msg"].endswith(f": deploy): halted on this host, nothing switched to {rid['rollout']}"), lab2["msg"]
    assert_whole(lab, "lab1", rid["rollout"])
    assert_whole(lab, "lab2", rid["hotfix"])
    assert [h["to"] for h in history(lab, "lab2")] == [rid["base"], rid["hotfix"]]
    events = journal(lab, book)
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "halted"  # lab2 failed: the batch's budget


def test_prune_keeps_the_release_a_running_rollout_may_roll_back_to(
        scratch_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rollout deploying twice with keep_releases 2: the second deploy's prune used to remove the
    release the rollout recorded, so its rollback_all had nowhere to go. It is kept; the rollback lands."""
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    specs = dict(zip(("base", "rollout", "hotfix"), tiny_releases(lab, tmp_path, ["base", "rollout", "hotfix"]),
                     strict=True))
    rid = {name: load_spec(path).release_id for name, path in specs.items()}
    assert run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(specs["base"])).rc == 0
    assert run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(specs["rollout"])).rc == 0
    keep2 = {name: tmp_path / f"{name}-keep2.yml" for name in ("rollout", "hotfix")}
    for name, path in keep2.items():
        path.write_text(specs[name].read_text().replace(f"name: {name}", f"name: {name}-keep2")
                        + "keep_releases: 2\n")
    twice = tmp_path / "twice.yml"
    twice.write_text(yaml.safe_dump([{"name": "twice", "hosts": "lab1", "on_failure": "rollback_all",
                                      "tasks": [{"name": "first", "release": str(keep2["rollout"])},
                                                {"name": "second", "release": str(keep2["hotfix"])},
                                                {"name": "verdict", "command": "false"}]}]))
    back = run_cli(capsys, "-i", inv, "run", str(twice), "--json")
    assert back.rc == 2 and back.json()["status"] == "halted", back.out + back.err
    assert_whole(lab, "lab1", rid["rollout"])  # rolled back to what the rollout recorded: still on the host
    assert [h["to"] for h in history(lab, "lab1")][-3:] == [load_spec(keep2["rollout"]).release_id,
                                                            load_spec(keep2["hotfix"]).release_id, rid["rollout"]]
    events = journal(lab, twice)
    assert [(e["host"], e["status"], e["to"]) for e in events if e.get("event") == "rollback" and e.get("host")] \
        == [("lab1", "rolled-back", rid["rollout"])]
    assert events[-1]["event"] == "run_end" and events[-1]["status"] == "halted"


def test_a_killed_rollout_leaves_its_hosts_free(scratch_lab: LabHandle, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The controller SIGKILLed while its rollout holds both hosts (one deployed, one not yet): its agents
    end with their connections and the locks go with them; the next deploy needs no --break-lock."""
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    specs = dict(zip(("base", "rollout", "hotfix"), tiny_releases(lab, tmp_path, ["base", "rollout", "hotfix"]),
                     strict=True))
    rid = {name: load_spec(path).release_id for name, path in specs.items()}
    assert run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(specs["base"])).rc == 0
    book = rollout_book(tmp_path, "rollout-a", specs["rollout"], "lab", barrier="a")
    a = start(lab, "run", str(book))
    try:
        wait_until(lambda: waiting_or_done(lab, book, a), "A's canary (lab1) deployed", timeout=300)
        assert a.poll() is None, finish(a)
        assert all(release_state(lab, h)["lock_held"] for h in lab.hosts)  # both taken for the run
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    wait_until(lambda: not any(release_state(lab, h)["lock_held"] for h in lab.hosts),
               "the killed run's agents let go of the locks", timeout=60)
    b = run_cli(capsys, "-i", inv, "-l", "lab2", "deploy", str(specs["hotfix"]), "--json")
    assert b.rc == 0 and b.json()["hosts"]["lab2"]["value"]["broke_lock"] is None, b.out + b.err
    assert_whole(lab, "lab1", rid["rollout"])
    assert_whole(lab, "lab2", rid["hotfix"])
    assert [h["to"] for h in history(lab, "lab2")] == [rid["base"], rid["hotfix"]]
    assert journal(lab, book)[-1]["event"] != "run_end"  # the killed run never said how it ended
