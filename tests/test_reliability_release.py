"""Faults during deploy on the lab fleet, each ending with the state of every host checked: a bad
service (exits, gate fails, /health, /server_info or the warm-up's /generate hangs) rolled back
within the gate's timeout; a disk that
fills during the build; a host whose sshd dies mid-deploy, then a re-run that finishes the job."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import run_cli, wall_clock
from lab_support import REPO, LabHandle, process_gone
from reliability_support import (
    ARRIVAL_LAG,
    assert_timeout_honoured,
    assert_whole,
    fault_happened,
    hung_requests,
    log_size,
    release_state,
    served_release,
    wait_until,
    write_spec,
)
from service_cleanup import clean_releases, unmount

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
RELEASES = REPO / "playbooks" / "releases"
PLAIN = RELEASES / "sglang-0.5.23-lab.yml"
DDTREE = RELEASES / "ddtree-sglang-0.5.23-lab.yml"
FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
# /opt/fleetctl itself may be a test's mount point: its contents go
CLEAN = clean_releases("/opt/fleetctl/*")


# A base venv under /opt: releases cloned from it are hard links (same filesystem), so a deploy
# takes about a second, and every fault test can afford its own.
BASE = "/opt/ml-base"
STEADY = """\
    service:
      standin: true
      args: [--speculative-algorithm, DFLASH]
    health: {timeout: 30, interval: 0.2}
    """


@pytest.fixture(scope="module")
def deployed_lab(release_free_lab: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabHandle]:
    """lab1 and lab3 running a steady release over /opt/ml-base (the one every fault falls back to)."""
    lab = release_free_lab
    for host in ("lab1", "lab3"):
        lab.ssh(host, f"rm -rf {BASE} && cp -a /root/ml-env {BASE}")
    steady = write_spec(tmp_path_factory.mktemp("steady"), "steady", STEADY, base=BASE)
    r = subprocess.run([FLEETCTL, "-i", str(lab.inventory_path), "-l", "lab1,lab3", "deploy", str(steady)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    yield lab
    for host in ("lab1", "lab3"):
        lab.ssh(host, CLEAN + f"; rm -rf {BASE}")


# Every gate's timeout in the sick spec: short, so TIMEOUT_SLACK is large beside it, and far from
# the defaults (10 s for a threshold's request, 120 s for a warm-up) a regression would fall back to.
GATE_TIMEOUT = 3
SICK = {
    "exits": ("args: [--speculative-algorithm, NOSUCH]\n", "GET /health", "the service exited"),
    "503": ("args: [--standin-health-status, '503']\n", "GET /health", "not healthy within 3s (last: HTTP 503)"),
    "hangs": ("args: [--standin-hang, /health]\n", "GET /health", "not healthy within 3s (last: timeout"),
    "threshold": ("args: [--speculative-algorithm, DFLASH, --standin-accept-length, '1.5']\n",
                  "/server_info internal_states.0.avg_spec_accept_length >= 2",
                  "internal_states.0.avg_spec_accept_length = 1.5"),
    "server_info-hangs": ("args: [--speculative-algorithm, DFLASH, --standin-hang, /server_info]\n",
                          "/server_info internal_states.0.avg_spec_accept_length >= 2",
                          "/server_info did not answer within 3s"),
    "generate-hangs": ("args: [--speculative-algorithm, DFLASH, --standin-hang, /generate]\n", "warm-up",
                       "no answer from /generate within the warm-up's 3s (0 of 4 requests answered)"),
}


@pytest.mark.parametrize("fault", sorted(SICK))
def test_bad_service_rolled_back_within_the_gate_timeout(deployed_lab: LabHandle, tmp_path: Path, fault: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    args, gate, detail = SICK[fault]
    spec = write_spec(tmp_path, f"sick-{fault}", f"""\
        service:
          standin: true
          {args.strip()}
        health:
          timeout: {GATE_TIMEOUT}
          interval: 0.2
          warmup: {{requests: 4, max_tokens: 30, timeout: {GATE_TIMEOUT}}}
          thresholds: [{{field: internal_states.0.avg_spec_accept_length, min: 2, timeout: {GATE_TIMEOUT}}}]
        """, base=BASE)
    before = {h: release_state(deployed_lab, h)["current"] for h in ("lab1", "lab3")}
    log_at = log_size(deployed_lab, "lab1")
    with wall_clock() as took:
        r = run_cli(capsys, "-i", str(deployed_lab.inventory_path), "-l", "lab1", "deploy", str(spec), "--json")
    assert r.rc == 2, r.out + r.err
    if fault.endswith("hangs"):
        # The hung requests as the server saw them, from the first one's arrival to the last close
        # (fleetctl gave up): the gate's timeout, not a default, not once per request. A threshold's or
        # the warm-up's wait begins with its request; /health's began at the restart, before this
        # server listened (its first requests refused), so only the test's clock bounds it below.
        hung = hung_requests(deployed_lab, "lab1", log_at)
        fault_happened(hung, f"a request hung on lab1's stand-in ({args.strip()})")
        waited = max(at + w for _, at, w in hung) - min(at for _, at, _ in hung)
        lag = GATE_TIMEOUT if fault == "hangs" else ARRIVAL_LAG
        assert_timeout_honoured(waited, GATE_TIMEOUT, f"{fault}: the hung requests", lag=lag)
        assert took.seconds >= GATE_TIMEOUT, took
    lab1 = r.json()["hosts"]["lab1"]
    assert lab1["status"] == "failed" and lab1["value"]["outcome"] == "rolled-back"
    failed = lab1["value"]["gates"][-1]
    assert (failed["name"], failed["ok"]) == (gate, False) and detail in failed["detail"], failed
    assert lab1["reason"] == f"health gate failed: {gate}: {failed['detail']}; rolled back to {before['lab1']}"
    # The whole deploy (build, switch, the gates, rollback and its gates) by the test's own clock: a
    # guard against a hang (the stand-in holds a hung request for good), not a measure of the timeout.
    assert took.seconds < 60, took
    assert lab1["value"]["rollback_gates"][0]["ok"] is True
    for host in ("lab1", "lab3"):
        assert_whole(deployed_lab, host, before[host], base=BASE)
        assert served_release(deployed_lab, host) == before[host]
    st = run_cli(capsys, "-i", str(deployed_lab.inventory_path), "-l", "lab1", "status", "--json")
    assert st.json()["hosts"]["lab1"]["value"]["current"] == before["lab1"]
    assert st.json()["hosts"]["lab1"]["value"]["health"] == "200"


def test_an_accept_length_gate_needs_the_warm_up(deployed_lab: LabHandle, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A freshly started server reports no acceptance length until it has served a speculative
    step, as SGLang: the threshold fails without a warm-up, and passes after one."""
    body = """\
        service:
          standin: true
          args: [--speculative-algorithm, DFLASH, --standin-accept-length, '3.2']
        health:
          timeout: 10
          interval: 0.2
          {warmup}
          thresholds: [{{field: internal_states.0.avg_spec_accept_length, min: 3}}]
        """
    inv = str(deployed_lab.inventory_path)
    before = release_state(deployed_lab, "lab1")["current"]
    cold = write_spec(tmp_path, "cold", body.format(warmup=""), base=BASE)
    r = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(cold), "--json")
    assert r.rc == 2, r.out + r.err
    assert r.json()["hosts"]["lab1"]["value"]["gates"][-1]["detail"] == (
        "internal_states.0.avg_spec_accept_length not found or not a number in /server_info")
    assert_whole(deployed_lab, "lab1", before, base=BASE)  # rolled back whole, serving the release before
    warm = write_spec(tmp_path, "warm", body.format(warmup="warmup: {requests: 2, max_tokens: 32}"), base=BASE)
    r = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(warm), "--json")
    assert r.rc == 0, r.out + r.err
    gates = {g["name"]: g for g in r.json()["hosts"]["lab1"]["value"]["gates"]}
    assert gates["warm-up"]["detail"].startswith("2 requests, 64 tokens: accept length 3.20")
    assert gates["/server_info internal_states.0.avg_spec_accept_length >= 3"]["detail"].endswith("= 3.2")
    assert_whole(deployed_lab, "lab1", load_spec(warm).release_id, base=BASE)


def test_a_canary_slower_than_the_release_before_is_rolled_back_with_both_numbers(
        deployed_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = """\
        service:
          standin: true
          args: [--speculative-algorithm, DFLASH, --standin-decode-tps, '{tps}']
        health:
          timeout: 10
          interval: 0.2
          warmup: {{requests: 2, max_tokens: 40}}
          canary: {{max_regression_percent: 10}}
        """
    inv = str(deployed_lab.inventory_path)
    fast = write_spec(tmp_path, "fast", body.format(tps=400), base=BASE)
    assert run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(fast)).rc == 0
    fast_id = load_spec(fast).release_id
    slow = write_spec(tmp_path, "slow", body.format(tps=100), base=BASE)  # the stand-in made slow on purpose
    r = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(slow), "--json")
    assert r.rc == 2, r.out + r.err
    lab1 = r.json()["hosts"]["lab1"]
    canary = lab1["value"]["gates"][-1]
    assert canary["name"] == f"canary vs {fast_id}" and not canary["ok"]
    now, before = canary["numbers"]["now"]["decode_tps"], canary["numbers"]["before"]["decode_tps"]
    # both measured, through the real HTTP path; a loaded machine slows the fast stand-in too (296 of its
    # 400 tok/s was seen at load 25), so the fast one is judged against the slow one, not a constant
    assert now < 110 and before > 1.5 * now
    assert f"decode tok/s {now:g} is" in canary["detail"] and f"below {fast_id}'s {before:g}" in canary["detail"]
    assert lab1["reason"].startswith(f"health gate failed: canary vs {fast_id}: decode tok/s")
    assert lab1["reason"].endswith(f"rolled back to {fast_id}")
    assert served_release(deployed_lab, "lab1") == fast_id
    assert_whole(deployed_lab, "lab1", fast_id, base=BASE)


def test_a_release_switched_but_never_gated_is_judged_against_the_release_it_replaced(
        deployed_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A deploy cut off after the switch and restart, before its gates (host lost, Ctrl-C): the
    re-run finds the release serving but never gated, so the canary compares it with the release it
    replaced, whose measurement is on the host, and rolls a slower release back."""
    from fleetctl.inventory import load_inventory
    from fleetctl.liveness import who
    from fleetctl.release import servers
    from fleetctl.release.service import layout_for
    from fleetctl.transport.fleet import Fleet

    body = ("service:\n  standin: true\n  args: [--speculative-algorithm, DFLASH, --standin-decode-tps, '{tps}']\n"
            "health: {{timeout: 10, interval: 0.2, warmup: {{requests: 2, max_tokens: 40}}, "
            "canary: {{max_regression_percent: 10}}}}\n")
    inv = str(deployed_lab.inventory_path)
    fast = write_spec(tmp_path, "fast2", body.format(tps=400), base=BASE)
    slow = write_spec(tmp_path, "slow2", body.format(tps=100), base=BASE)
    fast_id, slow_id = load_spec(fast).release_id, load_spec(slow).release_id
    assert run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(fast)).rc == 0
    assert run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(slow), "--stage").rc == 0
    inventory = load_inventory(deployed_lab.inventory_path)
    with Fleet(inventory, inventory.select("lab1")) as fleet:  # what the cut-off deploy did: switch, restart
        ctx = fleet.contexts["lab1"]
        assert servers.switch_over(ctx, layout_for(ctx.vars), slow_id, "deploy", who("cut off"), [], [None]) is None
    assert served_release(deployed_lab, "lab1") == slow_id
    r = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(slow), "--json")
    assert r.rc == 2, r.out + r.err
    lab1 = r.json()["hosts"]["lab1"]
    canary = lab1["value"]["gates"][-1]
    assert canary["name"] == f"canary vs {fast_id}" and not canary["ok"], canary
    assert canary["numbers"]["before"]["decode_tps"] > 1.5 * canary["numbers"]["now"]["decode_tps"]
    assert lab1["reason"].endswith(f"rolled back to {fast_id}")
    assert_whole(deployed_lab, "lab1", fast_id, base=BASE)


def test_a_release_built_before_its_base_changed_is_built_again_under_a_new_id(
        deployed_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The base venv is changed by hand after a release was built from it (a distribution copied
    in, as a hand overlay does): the next deploy does not reuse the old build; it builds again as
    <id>.b<fingerprint> and serves that. Refused in one line when the stale build is the one
    serving, unless --rebuild; `releases remove` removes the stale build, never the current one."""
    inv = str(deployed_lab.inventory_path)
    steady = release_state(deployed_lab, "lab1")["current"]
    spec = write_spec(tmp_path, "rebuilt", STEADY, base=BASE)
    rid = load_spec(spec).release_id
    assert run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(spec)).rc == 0
    assert run_cli(capsys, "-i", inv, "-l", "lab1", "rollback", "--to", steady).rc == 0
    handmade = f"{BASE}/lib/python3.11/site-packages/handmade-1.0.dist-info"
    deployed_lab.ssh("lab1", f"mkdir -p {handmade} && printf 'Metadata-Version: 2.1\\nName: handmade\\n"
                             f"Version: 1.0\\n' > {handmade}/METADATA && echo 'handmade-1.0.dist-info/METADATA,,' "
                             f"> {handmade}/RECORD")
    try:
        r = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(spec), "--json")
        assert r.rc == 0, r.out + r.err
        value = r.json()["hosts"]["lab1"]["value"]
        new_id = value["release_id"]
        assert new_id.startswith(f"{rid}.b") and new_id != rid
        assert value["rebuilt"].startswith(f"base changed since {rid} was built (")
        assert served_release(deployed_lab, "lab1") == new_id
        assert deployed_lab.ssh("lab1", f"ls /opt/fleetctl/releases/{new_id}/venv/lib/python3.11/site-packages/"
                                        "handmade-1.0.dist-info/METADATA", check=False).returncode == 0
        # the stale build is now only a folder; the serving one cannot be removed
        gone = run_cli(capsys, "-i", inv, "-l", "lab1", "releases", "remove", rid)
        assert gone.rc == 0 and f"lab1: removed /opt/fleetctl/releases/{rid}" in gone.out
        kept = run_cli(capsys, "-i", inv, "-l", "lab1", "releases", "remove", new_id)
        assert kept.rc == 2 and kept.err == (f"lab1: failed: release {new_id} is the current one: roll back or "
                                             "deploy another first\n")
    finally:
        deployed_lab.ssh("lab1", f"rm -rf {handmade}")
    # the base changes back under the serving build: refused in one line, --rebuild goes on
    r = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(spec), "--json")
    assert r.rc == 0 and r.json()["hosts"]["lab1"]["value"]["release_id"] == rid  # rid's build is gone: fresh
    deployed_lab.ssh("lab1", f"mkdir -p {handmade} && echo 'handmade-1.0.dist-info/METADATA,,' > {handmade}/RECORD")
    try:
        refused = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(spec))
        assert refused.rc == 2 and f"lab1: failed: release {rid} is serving but was built from a base that has " \
            "changed since" in refused.err and "pass --rebuild" in refused.err
        assert served_release(deployed_lab, "lab1") == rid
        forced = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(spec), "--rebuild", "--json")
        assert forced.rc == 0, forced.out + forced.err
        rebuilt = forced.json()["hosts"]["lab1"]["value"]["release_id"]
        assert rebuilt != rid
        assert_whole(deployed_lab, "lab1", rebuilt, base=BASE)  # whole against the base it was built from
    finally:
        deployed_lab.ssh("lab1", f"rm -rf {handmade}")


def test_disk_full_during_the_build_fails_cleanly(deployed_lab: LabHandle, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """lab2's /opt/fleetctl becomes a small tmpfs (in lab2's own mount namespace); after one release
    it is filled up to a few pages, and the next release's build runs out of space."""
    lab, tiny = deployed_lab, "/root/tiny-env"
    first = write_spec(tmp_path, "tiny", "service: {standin: true}\nhealth: {timeout: 30, interval: 0.2}\n",
                       base=tiny, sglang=False)
    second = write_spec(tmp_path, "tiny2", "service: {standin: true}\nhealth: {timeout: 30, interval: 0.2}\n",
                        base=tiny, sglang=False)
    one, two = load_spec(first).release_id, load_spec(second).release_id
    lab.ssh("lab2", f"{CLEAN}; rm -rf {tiny} && /usr/bin/python3 -m venv --without-pip {tiny} && "
                    "mkdir -p /opt/fleetctl && mount -t tmpfs -o size=2m fleetctl-full /opt/fleetctl")
    inv = str(lab.inventory_path)
    try:
        assert run_cli(capsys, "-i", inv, "-l", "lab2", "deploy", str(first)).rc == 0
        lab.ssh("lab2", "dd if=/dev/zero of=/opt/fleetctl/filler bs=4k 2>/dev/null "
                        "count=$(( $(stat -f -c %a /opt/fleetctl) - 2 ))")  # two pages left
        fault_happened(lab.ssh("lab2", "findmnt -n -t tmpfs -o SIZE /opt/fleetctl; stat -f -c %a /opt/fleetctl"
                               ).stdout.split() == ["2M", "2"], "lab2's /opt/fleetctl a full 2 MB tmpfs")
        r = run_cli(capsys, "-i", inv, "-l", "lab2", "deploy", str(second), "--json")
        assert r.rc == 2
        reason = r.json()["hosts"]["lab2"]["reason"]
        assert reason.startswith("release_host: DiskFull: no space left on device in /opt/fleetctl/releases "
                                 "(writing "), reason
        assert reason.endswith(f" of release {two}); the partial release was removed, nothing switched"), reason
        human = run_cli(capsys, "-i", inv, "-l", "lab2", "deploy", str(second))
        assert "lab2: failed: release_host: DiskFull: no space left on device in /opt/fleetctl/releases" in \
            " ".join(human.err.split())
        assert_whole(lab, "lab2", one, base=tiny)  # the previous release intact, no temporary folder left
        assert served_release(lab, "lab2") == one
        assert lab.ssh("lab2", "ls -A /opt/fleetctl/releases").stdout.split() == [one]
        # room again: the same run finishes the job
        lab.ssh("lab2", "rm /opt/fleetctl/filler")
        done = run_cli(capsys, "-i", inv, "-l", "lab2", "deploy", str(second))
        assert done.rc == 0, done.out + done.err
        assert_whole(lab, "lab2", two, base=tiny)
    finally:
        lab.ssh("lab2", f"{CLEAN}; {unmount('/opt/fleetctl')}; rm -rf {tiny}", check=False)
    assert lab.ssh("lab2", "findmnt -n /opt/fleetctl; true").stdout.strip() == ""


def test_sshd_killed_mid_deploy_then_rerun_finishes(deployed_lab: LabHandle, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """lab1's sshd and every process of its sessions die while its new release waits for /health."""
    lab = deployed_lab
    slow = write_spec(tmp_path, "slow", """\
        service:
          standin: true
          args: [--standin-start-delay, "6"]
        health: {timeout: 60, interval: 0.2}
        """, base=BASE)
    new = load_spec(slow).release_id
    old = {h: release_state(lab, h)["current"] for h in ("lab1", "lab3")}
    proc = subprocess.Popen([FLEETCTL, "-i", str(lab.inventory_path), "-l", "lab1,lab3", "deploy", str(slow),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    sshd = lab.pids()["lab1"]
    try:
        def still_running() -> None:
            assert proc.poll() is None, proc.communicate()

        # until lab1 has switched to the new release (its gate now waits)
        wait_until(lambda: lab.ssh("lab1", "readlink /opt/fleetctl/current", check=False).stdout.strip().endswith(new),
                   "lab1 switched to the new release", timeout=120, alive=still_running)
        lab.stop("lab1")
        fault_happened(process_gone(sshd), f"lab1's sshd (pid {sshd}) killed")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, out + err
    hosts = json.loads(out)["hosts"]
    assert hosts["lab3"]["status"] == "ok" and hosts["lab3"]["value"]["outcome"] == "deployed"
    assert hosts["lab1"]["status"] == "unreachable"
    # the agent's connection dropped mid-call ("connection lost"), or its restart found sshd gone
    assert hosts["lab1"]["reason"].startswith(("connection lost during the run",
                                                f"cannot connect to {lab.addresses['lab1']}:22")), hosts["lab1"]
    lab.start("lab1")
    state = release_state(lab, "lab1")
    assert state["current"] in (old["lab1"], new)  # old or new, whole either way
    # its server died with the host; the supervisor's boot entry brings it back, serving current
    wait_until(lambda: release_state(lab, "lab1", base=BASE)["service_pid"], "lab1's server back after the restart")
    assert_whole(lab, "lab1", state["current"], base=BASE)
    assert_whole(lab, "lab3", new, base=BASE)
    again = run_cli(capsys, "-i", str(lab.inventory_path), "-l", "lab1,lab3", "deploy", str(slow), "--json")
    assert again.rc == 0, again.out + again.err
    outcomes = {h: v["value"]["outcome"] for h, v in again.json()["hosts"].items()}
    # lab1 switched before its sshd died (now serving new again, gated: unchanged) or not (deployed now)
    assert outcomes == {"lab1": "unchanged" if state["current"] == new else "deployed", "lab3": "unchanged"}
    # the gates ran again on every host, lab3 unchanged too: serving is not the same as healthy
    for host, v in again.json()["hosts"].items():
        assert [(g["name"], g["ok"]) for g in v["value"]["gates"]] == [("GET /health", True)], (host, v)
    for host in ("lab1", "lab3"):
        assert_whole(lab, host, new, base=BASE)
        assert served_release(lab, host) == new
