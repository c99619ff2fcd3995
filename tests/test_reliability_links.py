"""Faults on the lab's shaped links (fleetctl/lab/netfaults.py, set as a user would with `fleetctl lab
links`), on a 3-host lab of this module: a host partitioned mid-rollout (its packets dropped, nothing
refused), a host 300 ms away, 5% loss during an overlay and a model sync, a bastion killed mid-run.
Each ends with every host whole (nothing half-switched or half-written, the lock free), the exit code
and the one line a user reads. Nothing here asserts timing (only that a fault really happened): the
bounds are wide, for a loaded 2-core machine."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cli_support import run_cli
from lab_support import _NET, LabHandle, lab_usable, private_lab, process_gone, worker_lab_dir
from model_support import make_folder_model
from reliability_support import (
    assert_state_sound,
    assert_whole,
    fault_happened,
    release_state,
    tiny_releases,
    wait_until,
)

from fleetctl.lab import LabPaths, netfaults
from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
FLEETCTL = [sys.executable, "-m", "fleetctl.cli.main"]
# The new release's server answers /health only after 20 s: the fault lands inside the gate, even when
# a loaded machine is slow to see the switch and to set the fault.
SLOW = 'service:\n  standin: true\n  args: [--standin-start-delay, "20"]\nhealth: {timeout: 120, interval: 0.2}\n'
TIMEOUT = 30  # -T: how long a silent host is waited for


def links(lab: LabHandle, *args: str) -> str:
    """`fleetctl lab links` on this lab, as a user types it; its one line (or lines)."""
    done = subprocess.run([*FLEETCTL, "lab", "links", "--dir", str(lab.dir), *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def links_lab() -> Iterator[LabHandle]:
    why = lab_usable()
    if why:
        pytest.skip(why)
    with private_lab(worker_lab_dir("test-lab-links"), 3, f"127.{_NET}.87.0") as lab:
        yield lab


@pytest.fixture
def faulty_lab(links_lab: LabHandle) -> Iterator[LabHandle]:
    """The module's lab; afterwards its faults removed and its hosts up, whatever the test did."""
    try:
        yield links_lab
    finally:
        netfaults.clear(links_lab.dir)
        links_lab.restore()


def releases(lab: LabHandle, folder: Path, name: str) -> tuple[Path, Path]:
    """NAME-1 and NAME-2, whose server is 20 s slow to answer /health."""
    (first,) = tiny_releases(lab, folder, [f"{name}-1"])
    second = folder / f"{name}-2.yml"
    second.write_text(first.read_text().replace(f"name: {name}-1", f"name: {name}-2").split("service:")[0] + SLOW)
    return first, second


def test_a_host_partitioned_mid_rollout_fails_after_the_timeout_the_other_finishes_and_a_rerun_completes(
        faulty_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = faulty_lab, str(faulty_lab.inventory_path)
    first, second = releases(lab, tmp_path, "cut")
    old, new = load_spec(first).release_id, load_spec(second).release_id
    assert run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(first)).rc == 0
    proc = subprocess.Popen([*FLEETCTL, "-i", inv, "-T", str(TIMEOUT), "-l", "all", "deploy", str(second), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def still_running() -> None:
            assert proc.poll() is None, proc.communicate()

        wait_until(lambda: release_state(lab, "lab1")["current"] == new, "lab1 switched to v2 (its gate waits)",
                   timeout=120, interval=0.2, alive=still_running)
        assert links(lab, "--partition", "--host", "lab1") == "link of lab1: partitioned (every packet dropped)"
        out, err = proc.communicate(timeout=TIMEOUT + 240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    fault_happened(netfaults.dropped(lab.dir).get(lab.addresses["lab1"]), "packets to or from lab1 dropped")
    assert proc.returncode == 2, out + err
    hosts = json.loads(out)["hosts"]
    for host in ("lab2", "lab3"):
        assert hosts[host]["status"] == "ok" and hosts[host]["value"]["outcome"] == "deployed", hosts[host]
    # the agent call waiting on the gate runs out (-T and the gate's timeout), then one more check
    assert hosts["lab1"]["status"] == "unreachable", hosts["lab1"]
    assert hosts["lab1"]["reason"].startswith("the host stopped answering: no answer within "), hosts["lab1"]
    assert "Traceback" not in err
    assert links(lab, "--heal", "--host", "lab1") == "link of lab1: no faults"
    # lab1 switched before the partition: whole on the new release (its gate never passed) or back on
    # the old, never half-switched. Its lock may still be held: the agent's session is half-open there
    # (the controller's close was dropped), so the whole-host check comes after the re-run.
    state = release_state(lab, "lab1")
    assert state["current"] in (old, new) and (state["state"] or {}).get("current") == state["current"], state
    assert state["bad"] == state["missing"] == state["temps"] == [] and state["state_error"] is None, state
    for host in ("lab2", "lab3"):
        assert_whole(lab, host, new)
    rerun(capsys, inv, second)
    for host in lab.hosts:
        assert_whole(lab, host, new)


def rerun(capsys: pytest.CaptureFixture[str], inv: str, spec: Path, limit: str = "all") -> None:
    """The deploy again, after the fault: it completes. A host that was cut off mid-run may still
    hold its deploy lock (its agent's session half-open on the host: the controller's close never
    reached it), then the re-run refuses it in one line naming --break-lock, which completes it."""
    again = run_cli(capsys, "-i", inv, "-l", limit, "deploy", str(spec), "--json")
    if again.rc == 2:
        refused = [h for h, v in again.json()["hosts"].items() if v["status"] != "ok"]
        for host in refused:
            reason = again.json()["hosts"][host]["reason"]
            assert reason.startswith("locked by another run: ") and reason.endswith(
                "still holds the lock; --break-lock ends that agent and takes the lock"), reason
        again = run_cli(capsys, "-i", inv, "-l", ",".join(refused), "deploy", str(spec), "--break-lock", "--json")
    assert again.rc == 0, again.out + again.err


def test_a_host_300_ms_away_deploys_with_its_peers(faulty_lab: LabHandle, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = faulty_lab, str(faulty_lab.inventory_path)
    (spec,) = tiny_releases(lab, tmp_path, ["far"])
    new = load_spec(spec).release_id
    assert links(lab, "--delay", "300", "--host", "lab3") == "link of lab3: 300 ms delay each way"
    # a lower bound only (load can make it slower, never faster): an ssh login is several round trips
    started = time.monotonic()
    lab.ssh("lab3", "true")
    fault_happened(time.monotonic() - started >= 2 * 0.3, "lab3's round trips take 600 ms more")
    r = run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(spec), "--json")
    assert r.rc == 0, r.out + r.err
    assert {h: v["value"]["outcome"] for h, v in r.json()["hosts"].items()} == dict.fromkeys(lab.hosts, "deployed")
    for host in lab.hosts:
        assert_whole(lab, host, new)


# A hand-made distribution (no pip) with 16 MiB of data files: enough packets that 5% loss drops some.
BULKY_DIST = r"""
import base64, hashlib, os, sys
site = sys.argv[1]
files = {"bulky/__init__.py": b"VALUE = 1\n",
         "bulky-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: bulky\nVersion: 1.0\n",
         "bulky-1.0.dist-info/INSTALLER": b"pip\n"}
files.update({"bulky/data%d.bin" % i: os.urandom(2 << 20) for i in range(8)})
lines = []
for rel, data in files.items():
    os.makedirs(os.path.dirname(os.path.join(site, rel)), exist_ok=True)
    open(os.path.join(site, rel), "wb").write(data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    lines.append("%s,sha256=%s,%d" % (rel, digest, len(data)))
lines.append("bulky-1.0.dist-info/RECORD,,")
open(os.path.join(site, "bulky-1.0.dist-info/RECORD"), "w").write("\n".join(lines) + "\n")
"""
ENV = "/opt/lossy-env"
SITE = f"{ENV}/lib/python3.11/site-packages"


def test_five_percent_loss_during_an_overlay_it_completes_and_verifies(
        faulty_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = faulty_lab, str(faulty_lab.inventory_path)
    for host in lab.hosts:
        lab.ssh(host, f"rm -rf {ENV} && /usr/bin/python3 -m venv --without-pip {ENV}")
    lab.ssh("lab1", f"/usr/bin/python3 - {SITE} <<'EOF'\n{BULKY_DIST}\nEOF")
    assert links(lab, "--loss", "5").splitlines() == [f"link of {h}: 5% loss each way" for h in lab.hosts]
    r = run_cli(capsys, "-i", inv, "-l", "lab2,lab3", "venv", "overlay", "--from", "lab1", "--venv", ENV, "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    dropped = netfaults.dropped(lab.dir)
    fault_happened(all(dropped.get(lab.addresses[h]) for h in lab.hosts), f"packets of every host dropped: {dropped}")
    drift = run_cli(capsys, "-i", inv, "-l", "all", "drift", "--baseline", "lab1", "--venv", ENV, "--verify-files",
                    "--json")
    assert drift.rc == 0, drift.out[-3000:] + drift.err
    want = lab.ssh("lab1", f"cd {SITE} && sha256sum bulky/*").stdout
    for host in ("lab2", "lab3"):
        assert lab.ssh(host, f"cd {SITE} && sha256sum bulky/*").stdout == want, host
        assert lab.ssh(host, f"find {ENV} -name '*.fleetctl-tmp'").stdout == "", host
        assert_state_sound(lab, host)
    for host in lab.hosts:
        lab.ssh(host, f"rm -rf {ENV}")


MODEL = "/srv/models/lossy"


def test_five_percent_loss_during_a_model_sync_it_completes_and_verifies(
        faulty_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = faulty_lab, str(faulty_lab.inventory_path)
    give_peer_ssh(lab)
    for host in lab.hosts:
        lab.ssh(host, f"rm -rf {MODEL} /srv/models/.lossy.fleetctl-partial")
    made = make_folder_model(LabPaths(lab.dir).host_dir("lab1") / MODEL.strip("/"), shards=4, tensors_per_shard=3,
                             tensor_kib=1024)
    want = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(made.path.iterdir())}
    links(lab, "--loss", "5")
    r = run_cli(capsys, "-i", inv, "-l", "lab2,lab3", "models", "sync", MODEL, "--from", "lab1", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    dropped = netfaults.dropped(lab.dir)
    fault_happened(all(dropped.get(lab.addresses[h]) for h in lab.hosts), f"packets of every host dropped: {dropped}")
    verify = run_cli(capsys, "-i", inv, "-l", "lab2,lab3", "models", "verify", MODEL, "--full", "--json")
    assert verify.rc == 0, verify.out[-3000:] + verify.err
    for host in ("lab2", "lab3"):
        got = lab.ssh(host, f"cd {MODEL} && sha256sum * && ls -a /srv/models").stdout
        assert {line.split()[1]: line.split()[0] for line in got.splitlines() if "  " in line} == want, host
        assert ".lossy.fleetctl-partial" not in got, host
    for host in lab.hosts:
        lab.ssh(host, f"rm -rf {MODEL}")


def give_peer_ssh(lab: LabHandle) -> None:
    """Every host may ssh to every other as root (the lab's key and pinned host keys), as --direct needs."""
    for name in lab.hosts:
        ssh_dir = LabPaths(lab.dir).host_dir(name) / "root" / ".ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh_dir / "id_ed25519").write_bytes(lab.key_path.read_bytes())
        (ssh_dir / "id_ed25519").chmod(0o600)
        (ssh_dir / "known_hosts").write_text(lab.known_hosts.read_text())


def test_a_bastion_killed_mid_rollout_fails_the_host_behind_it_in_one_line_the_other_finishes(
        faulty_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """lab2 is reached through lab1 (jump_host); lab1's sshd and its sessions die while lab2's gate waits."""
    lab = faulty_lab
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["all"]["children"]["lab"]["hosts"]["lab2"]["jump_host"] = "lab1"
    inv = lab.dir / "behind-lab1.yml"  # beside the lab's key and known_hosts (relative paths)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    first, second = releases(lab, tmp_path, "hop")
    new = load_spec(second).release_id
    assert run_cli(capsys, "-i", str(inv), "-l", "lab2,lab3", "deploy", str(first)).rc == 0
    proc = subprocess.Popen([*FLEETCTL, "-i", str(inv), "-T", str(TIMEOUT), "-l", "lab2,lab3", "deploy", str(second),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def still_running() -> None:
            assert proc.poll() is None, proc.communicate()

        wait_until(lambda: release_state(lab, "lab2")["current"] == new, "lab2 switched (its gate waits)",
                   timeout=120, interval=0.2, alive=still_running)
        bastion = lab.pids()["lab1"]
        lab.stop("lab1")
        fault_happened(process_gone(bastion), f"the bastion's sshd (pid {bastion}) killed")
        out, err = proc.communicate(timeout=TIMEOUT + 240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, out + err
    hosts = json.loads(out)["hosts"]
    assert hosts["lab3"]["status"] == "ok" and hosts["lab3"]["value"]["outcome"] == "deployed", hosts["lab3"]
    # one line naming the hop that went away (the run's connection to lab2 went through it): the
    # connection lost, or (had the agent been started again) the bastion refusing the new one
    assert hosts["lab2"]["status"] == "unreachable", hosts["lab2"]
    reason, bastion = hosts["lab2"]["reason"], f"{lab.addresses['lab1']}:22"
    lost = reason.startswith("connection lost during the run (") and reason.endswith(f"its bastion {bastion} went away")
    assert lost or reason.startswith(f"cannot connect to bastion {bastion}: "), reason
    assert "Traceback" not in err
    lab.restore("lab1")
    state = release_state(lab, "lab2")
    assert_whole(lab, "lab2", state["current"], serving=None)
    assert_whole(lab, "lab3", new)
    rerun(capsys, str(inv), second, "lab2,lab3")
    for host in ("lab2", "lab3"):
        assert_whole(lab, host, new)
