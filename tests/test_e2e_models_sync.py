"""``fleetctl models sync`` on a 5-host lab: lab1 holds the model, lab2..lab5 get it through a chain of
host-to-host ssh links (each host's own key and known_hosts); a second sync sends nothing; a sync whose
controller is SIGKILLed, or whose middle host is stopped, is re-run to a complete, verified model on
every host, and no partial model is ever visible at the model's path; a host without room is refused
before any byte while the others proceed; a non-root login with become, an ssh_config alias and a host
reached through a bastion take part."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from cli_support import CliRun, run_cli
from lab_support import (
    _NET,
    REPO,
    LabHandle,
    host_processes,
    lab_usable,
    private_lab,
    user_inventory,
    worker_lab_dir,
)
from model_support import make_folder_model

from fleetctl.inventory import load_inventory
from fleetctl.lab import LabPaths
from fleetctl.models.chain import peer_argv
from fleetctl.transport.fleet import Fleet

pytestmark = pytest.mark.lab
TARGETS = ["lab2", "lab3", "lab4", "lab5"]
MANIFEST = ".fleetctl-manifest.json"


@pytest.fixture(scope="module")
def sync_lab() -> Iterator[LabHandle]:
    why = lab_usable()
    if why:
        pytest.skip(why)
    with private_lab(worker_lab_dir("test-lab-models"), 5, f"127.{_NET}.84.0") as lab:
        give_peer_ssh(lab)
        yield lab


def give_peer_ssh(lab: LabHandle) -> None:
    """Every host may ssh to every other as root: the lab's client key in its /root/.ssh and every
    host's pinned key in its known_hosts (as an operator sets up --direct)."""
    known = lab.known_hosts.read_text()
    for name in lab.hosts:
        ssh_dir = host_path(lab, name, "/root/.ssh")
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh_dir / "id_ed25519").write_bytes(lab.key_path.read_bytes())
        (ssh_dir / "id_ed25519").chmod(0o600)
        (ssh_dir / "known_hosts").write_text(known)


def host_path(lab: LabHandle, host: str, path: str) -> Path:
    """A path inside a lab host's private /root or /srv, seen from this machine."""
    top, _, rest = path.strip("/").partition("/")
    return LabPaths(lab.dir).host_dir(host) / top / rest


def source_model(lab: LabHandle, path: str, tensor_kib: int = 64) -> dict[str, str]:
    """A real safetensors model (4 shards, index, config, tokenizer) at ``path`` on lab1; its files' sha256."""
    folder = host_path(lab, "lab1", path)
    made = make_folder_model(folder, shards=4, tensors_per_shard=3, tensor_kib=tensor_kib)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(made.path.iterdir())}


def held(lab: LabHandle, host: str, path: str) -> dict[str, str]:
    folder = host_path(lab, host, path)
    if not folder.is_dir():
        return {}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.name != MANIFEST}


def cli(capsys: pytest.CaptureFixture[str], lab: LabHandle, *args: str, inventory: Path | None = None) -> CliRun:
    return run_cli(capsys, "-i", str(inventory or lab.inventory_path), *args)


def sync_args(path: str, *extra: str) -> list[str]:
    return ["-l", ",".join(TARGETS), "models", "sync", path, "--from", "lab1", "--json", *extra]


def clean(lab: LabHandle, path: str) -> None:
    for host in lab.hosts:
        lab.ssh(host, f"rm -rf {path} {os.path.dirname(path)}/.{os.path.basename(path)}.fleetctl-partial")


def test_sync_to_four_hosts_then_a_second_sync_sends_nothing(sync_lab: LabHandle,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    lab, path = sync_lab, "/srv/models/tiny"
    clean(lab, path)
    want = source_model(lab, path)
    r = cli(capsys, lab, *sync_args(path))
    assert r.rc == 0, r.out[-3000:] + r.err
    doc = r.json()
    for host in TARGETS:
        assert doc["hosts"][host]["status"] == "ok", doc["hosts"][host]
        assert doc["hosts"][host]["value"]["via"] == "chain"
        assert held(lab, host, path) == want, host
        manifest = json.loads(host_path(lab, host, path + "/" + MANIFEST).read_text())
        assert sorted(f["path"] for f in manifest["files"]) == sorted(want)
    # each byte left the source once (plus a few bytes of framing per chunk)
    assert doc["model_bytes"] <= doc["source_bytes_sent"] <= 1.01 * doc["model_bytes"]
    again = cli(capsys, lab, *sync_args(path))
    assert again.rc == 0, again.out[-3000:] + again.err
    doc = again.json()
    assert doc["source_bytes_sent"] == 0
    assert {h: v["value"]["state"] for h, v in doc["hosts"].items()} == dict.fromkeys(TARGETS, "complete")


def test_sync_from_a_folder_on_the_controller(sync_lab: LabHandle, capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    lab, path = sync_lab, "/srv/models/local"
    clean(lab, path)
    made = make_folder_model(tmp_path / "model", shards=2)
    want = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(made.path.iterdir())}
    r = cli(capsys, lab, "-l", "lab2,lab3", "models", "sync", path, "--from", str(made.path), "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert {h: held(lab, h, path) == want for h in ("lab2", "lab3")} == {"lab2": True, "lab3": True}


def test_a_host_without_room_is_refused_before_any_byte_the_others_proceed(
        sync_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    lab, path = sync_lab, "/srv/small/m"
    clean(lab, path)
    source_model(lab, path)
    lab.ssh("lab4", "mkdir -p /srv/small && mount -t tmpfs -o size=256k tmpfs /srv/small")
    try:
        r = cli(capsys, lab, *sync_args(path))
        listing = lab.ssh("lab4", "find /srv/small -mindepth 1").stdout
    finally:
        lab.ssh("lab4", "umount /srv/small")
    assert r.rc == 2, r.out[-3000:] + r.err
    doc = r.json()
    reason = doc["hosts"]["lab4"]["reason"]
    assert reason.startswith("lab4: no room for the model: ") and "free on the volume of /srv/small/m" in reason
    assert listing == ""  # nothing written there, not even a staging folder
    for host in ("lab2", "lab3", "lab5"):
        assert doc["hosts"][host]["status"] == "ok", doc["hosts"][host]


def start_sync(lab: LabHandle, path: str, *extra: str, inventory: Path | None = None) -> subprocess.Popen[str]:
    code = "import sys; from fleetctl.cli.main import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "-i", str(inventory or lab.inventory_path), *sync_args(path, *extra)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def never_partial(lab: LabHandle, path: str, want: dict[str, str], until: Callable[[], bool]) -> None:
    """Watch every target while ``until`` is false: the model's path holds nothing or the whole model
    (every file at its full size), never a part of it."""
    sizes = {name: host_path(lab, "lab1", path + "/" + name).stat().st_size for name in want}
    deadline = time.monotonic() + 600
    while not until() and time.monotonic() < deadline:
        for host in TARGETS:
            folder = host_path(lab, host, path)
            try:
                names = sorted(p.name for p in folder.iterdir())
                got = {name: (folder / name).stat().st_size for name in sizes}
            except FileNotFoundError:
                continue
            assert names == sorted([*sizes, MANIFEST]) and got == sizes, (host, names, got)
        time.sleep(0.02)


def shard_verified(lab: LabHandle, path: str, host: str) -> bool:
    """A shard has landed and been verified on ``host`` (renamed to its own name in the staging folder)."""
    staging = host_path(lab, host, os.path.dirname(path)) / f".{os.path.basename(path)}.fleetctl-partial"
    return any(staging.glob("*.safetensors"))


def test_a_killed_controller_then_a_rerun_completes_every_host(sync_lab: LabHandle,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    lab, path = sync_lab, "/srv/models/killed"
    clean(lab, path)
    want = source_model(lab, path, tensor_kib=1024)  # 12 MB, at 2 MB/s per link: several seconds
    proc = start_sync(lab, path, "--limit-rate", "2M")
    never_partial(lab, path, want, lambda: shard_verified(lab, path, "lab5") or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()  # still sending when killed
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert all(held(lab, h, path) in ({}, want) for h in TARGETS)  # nothing, or the whole model
    r = cli(capsys, lab, *sync_args(path))
    assert r.rc == 0, r.out[-3000:] + r.err
    assert all(held(lab, h, path) == want for h in TARGETS)
    # the re-run sent only what had not landed and been verified everywhere: not the first shard
    shard = host_path(lab, "lab1", path + "/model-00001-of-00004.safetensors").stat().st_size
    assert r.json()["source_bytes_sent"] < r.json()["model_bytes"] - shard // 2, r.out


def test_the_middle_host_stopped_mid_chain_then_a_rerun(sync_lab: LabHandle,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    lab, path = sync_lab, "/srv/models/middle"
    clean(lab, path)
    want = source_model(lab, path, tensor_kib=1024)
    proc = start_sync(lab, path, "--limit-rate", "2M", "--stall-timeout", "5")
    never_partial(lab, path, want, lambda: shard_verified(lab, path, "lab5") or proc.poll() is not None)
    with lab.stop("lab3"):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, out[-3000:] + err
        doc = json.loads(out)
        assert doc["hosts"]["lab3"]["status"] != "ok"
        for host in ("lab2", "lab4", "lab5"):  # the hosts behind lab3 were re-attached past it
            assert doc["hosts"][host]["status"] == "ok", doc["hosts"][host]
            assert held(lab, host, path) == want
    r = cli(capsys, lab, *sync_args(path))
    assert r.rc == 0, r.out[-3000:] + r.err
    assert all(held(lab, h, path) == want for h in TARGETS)


def test_nonroot_with_become_an_ssh_config_alias_and_a_bastion_take_part(
        sync_lab: LabHandle, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    lab, path = sync_lab, "/srv/models/mixed"
    clean(lab, path)
    want = source_model(lab, path)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(  # gpu-four: an alias, reached through lab3 as a bastion
        f"Host gpu-four\n  HostName {lab.addresses['lab4']}\n  User fleetop\n  IdentityFile {lab.key_path}\n"
        f"  ProxyJump root@{lab.addresses['lab3']}\n"
        f"Host {lab.addresses['lab3']}\n  IdentityFile {lab.key_path}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("FLEETCTL_SSH_CONFIG", raising=False)
    inventory = user_inventory(lab, tmp_path / "inv.yml", user="fleetop",
                               host_vars={h: {"ansible_become": True} for h in lab.hosts})
    doc = yaml.safe_load(inventory.read_text())
    hosts = doc["all"]["children"]["lab"]["hosts"]
    hosts["gpu-four"] = {k: v for k, v in hosts.pop("lab4").items()  # address, user and key from ssh_config
                         if k not in ("ansible_host", "ansible_user", "ansible_ssh_private_key_file")}
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = cli(capsys, lab, "-l", "lab2,lab3,gpu-four,lab5", "models", "sync", path, "--from", "lab1", "--json",
            inventory=inventory)
    assert r.rc == 0, r.out[-3000:] + r.err
    got = r.json()["hosts"]
    assert {h: got[h]["value"]["via"] for h in got} == dict.fromkeys(["lab2", "lab3", "gpu-four", "lab5"], "chain")
    for host in TARGETS:
        assert held(lab, host, path) == want, host
    inv = load_inventory(inventory)
    with Fleet(inv, [inv.hosts["gpu-four"]]) as fleet:  # the link to gpu-four goes through lab3
        argv = peer_argv(fleet.contexts["gpu-four"])
    assert argv[argv.index("-J") + 1] == f"root@{lab.addresses['lab3']}:22"
    owner = lab.ssh("lab4", f"stat -c %U {path}/config.json").stdout.strip()
    assert owner == "root"  # written as the become user, through fleetop's login


def test_a_host_its_peers_cannot_reach_is_fed_by_the_controller(sync_lab: LabHandle,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    lab, path = sync_lab, "/srv/models/relayed"
    clean(lab, path)
    want = source_model(lab, path)
    known = {h: host_path(lab, h, "/root/.ssh/known_hosts") for h in lab.hosts}
    saved = {h: k.read_text() for h, k in known.items()}
    try:  # no host has lab5's key pinned: every link to it fails its host key check
        for h, k in known.items():
            k.write_text("".join(line + "\n" for line in saved[h].splitlines()
                                 if not line.startswith(lab.addresses["lab5"] + " ")))
        r = cli(capsys, lab, *sync_args(path))
    finally:
        for h, k in known.items():
            k.write_text(saved[h])
    assert r.rc == 0, r.out[-3000:] + r.err
    hosts = r.json()["hosts"]
    assert {h: hosts[h]["value"]["via"] for h in TARGETS} == {"lab2": "chain", "lab3": "chain", "lab4": "chain",
                                                              "lab5": "relay"}
    assert any("Host key verification failed" in c for c in hosts["lab5"]["value"]["cuts"]), hosts["lab5"]
    assert all(held(lab, h, path) == want for h in TARGETS)
    # the relay round sent lab5 its files once more: the source sent the model twice, no more
    assert r.json()["source_bytes_sent"] <= 2.02 * r.json()["model_bytes"]


def chain_nodes(lab: LabHandle, host: str) -> list[int]:
    """The models sync node processes running on one lab host (python -c of the shipped module)."""
    found = []
    for pid in host_processes(lab, host):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"python" in argv[0] and any(b"zlib.decompress" in a for a in argv):
            found.append(pid)
    return found


def test_a_stalled_middle_host_is_cut_the_rest_complete_and_the_controller_feeds_it(
        sync_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    lab, path = sync_lab, "/srv/models/stalled"
    clean(lab, path)
    want = source_model(lab, path, tensor_kib=2048)  # 24 MB at 2 MB/s per link
    proc = start_sync(lab, path, "--limit-rate", "2M", "--stall-timeout", "3")
    never_partial(lab, path, want, lambda: shard_verified(lab, path, "lab3") or proc.poll() is not None)
    frozen = chain_nodes(lab, "lab3")
    assert frozen and proc.poll() is None
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)  # alive, connected, and taking nothing
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    assert proc.returncode == 0, out[-3000:] + err
    hosts = json.loads(out)["hosts"]
    assert {h: hosts[h]["value"]["via"] for h in TARGETS} == {"lab2": "chain", "lab3": "relay", "lab4": "chain",
                                                              "lab5": "chain"}
    assert any("stalled" in c for c in hosts["lab3"]["value"]["cuts"]), hosts["lab3"]
    assert all(held(lab, h, path) == want for h in TARGETS)
