"""``fleetctl models sync`` on a 3-host lab (lab1 the source, lab2 and lab3 the targets), what the first
sync test file does not cover: the hashes a sync proved as files landed are those the deploy tier reads
(the first verify after a sync hashes nothing again); a host that got the model by sync can be the
source of the next one; a Hugging Face cache model synced with its blobs, snapshot symlinks and refs;
a second sync of the same path on one host refused while the first holds it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import CliRun, run_cli
from lab_support import _NET, LabHandle, lab_usable, private_lab, user_inventory, worker_lab_dir
from lab_support import REPO as CHECKOUT
from model_support import MadeModel, make_folder_model, make_hf_cache_model
from test_e2e_models_sync import chain_nodes, give_peer_ssh, held, host_path

from fleetctl.vault import encrypt as vault_encrypt

pytestmark = pytest.mark.lab
TARGETS = ["lab2", "lab3"]
HUB, REPO = "/srv/hub", "fleetctl-test/tiny-draft"


@pytest.fixture(scope="module")
def lab3() -> Iterator[LabHandle]:
    why = lab_usable()
    if why:
        pytest.skip(why)
    with private_lab(worker_lab_dir("test-lab-models-more"), 3, f"127.{_NET}.86.0") as lab:
        give_peer_ssh(lab)
        yield lab


def cli(capsys: pytest.CaptureFixture[str], lab: LabHandle, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(lab.inventory_path), *args)


def clean(lab: LabHandle, path: str) -> None:
    staging = f"{os.path.dirname(path)}/.{os.path.basename(path)}.fleetctl-partial"
    for host in lab.hosts:
        lab.ssh(host, f"rm -rf {path} {staging} {staging}.lock")


def folder_on_lab1(lab: LabHandle, path: str) -> dict[str, str]:
    made = make_folder_model(host_path(lab, "lab1", path), shards=4, tensors_per_shard=2)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(made.path.iterdir())}


def test_the_first_deploy_check_after_a_sync_hashes_nothing_again(lab3: LabHandle,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    lab, path = lab3, "/srv/models/hashed"
    clean(lab, path)
    folder_on_lab1(lab, path)
    r = cli(capsys, lab, "-l", ",".join(TARGETS), "models", "sync", path, "--from", "lab1", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    check = cli(capsys, lab, "-l", ",".join(TARGETS), "models", "verify", path, "--json")
    assert check.rc == 0, check.out[-3000:] + check.err
    for host in TARGETS:
        (state,) = check.json()["hosts"][host]["value"]
        assert state["state"] == "ok", state
        assert state["hashed_bytes"] == 0, f"{host} hashed {state['hashed_bytes']} B the sync had proved"
        assert state["verified_at"] is not None
    # the store is keyed by the file as it is: a byte flipped since is still hashed and caught
    shard = host_path(lab, "lab2", f"{path}/model-00002-of-00004.safetensors")
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    again = cli(capsys, lab, "-l", "lab2", "models", "verify", path, "--json")
    assert again.rc == 1, again.out[-3000:]
    (state,) = again.json()["hosts"]["lab2"]["value"]
    assert state["state"] == "corrupt" and state["hashed_bytes"] > 0


def test_a_source_keeps_the_hashes_of_its_manifest_and_hashes_a_changed_file_again(
        lab3: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    """A source folder without a kept manifest is hashed once: its hashes go to the source's verified-hash
    store (the next sync from it reads no file again), keyed by each file's stat, so a file rewritten
    since at the same size is hashed again and the next target gets its new bytes."""
    lab, path = lab3, "/srv/models/sourced"
    clean(lab, path)
    want = folder_on_lab1(lab, path)
    r = cli(capsys, lab, "-l", "lab2", "models", "sync", path, "--from", "lab1", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    store_file = f"/var/lib/fleetctl/cache/models/verified-{hashlib.sha256(path.encode()).hexdigest()[:16]}.json"
    store = json.loads(lab.ssh("lab1", f"cat {store_file}").stdout)
    assert {os.path.basename(p): entry[4] for p, entry in store["files"].items()} == want
    shard = host_path(lab, "lab1", f"{path}/model-00003-of-00004.safetensors")
    data = bytearray(shard.read_bytes())
    data[-7] ^= 0xFF
    shard.write_bytes(bytes(data))
    want[shard.name] = hashlib.sha256(bytes(data)).hexdigest()
    r = cli(capsys, lab, "-l", "lab3", "models", "sync", path, "--from", "lab1", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert held(lab, "lab3", path) == want


def test_a_host_that_got_the_model_by_sync_is_the_next_source(lab3: LabHandle,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    lab, path = lab3, "/srv/models/relayed"
    clean(lab, path)
    want = folder_on_lab1(lab, path)
    r = cli(capsys, lab, "-l", "lab2", "models", "sync", path, "--from", "lab1", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    # lab2 now keeps the manifest beside the model: the source reads it instead of hashing again
    r = cli(capsys, lab, "-l", "lab3", "models", "sync", path, "--from", "lab2", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert held(lab, "lab3", path) == want


def hf_spec(tmp_path: Path, made: MadeModel) -> Path:
    spec = tmp_path / "hub.yml"
    spec.write_text("name: hub-sync\nversion: '1'\nbase: {adopt: /root/ml-env}\nrequires: {sglang: '==0.5.23'}\n"
                    f"models:\n  main: {{hf_cache: {HUB}, repo: {made.repo}, revision: {made.revision}}}\n"
                    "service:\n  standin: true\n  args: [--model-path, '{{ models.main.path }}']\n")
    return spec


def blobs_of(made: MadeModel) -> set[str]:
    return {os.path.basename(os.path.realpath(p)) for p in made.path.iterdir()}


def test_a_hugging_face_cache_model_syncs_only_its_revision(lab3: LabHandle, capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    lab = lab3
    for host in lab.hosts:
        lab.ssh(host, f"rm -rf {HUB}")
    cache = host_path(lab, "lab1", HUB)
    pinned = make_hf_cache_model(cache, repo=REPO, seed="pinned")
    newer = make_hf_cache_model(cache, repo=REPO, seed="newer")  # refs/main moves to it; not sent
    assert blobs_of(newer) - blobs_of(pinned)
    spec = hf_spec(tmp_path, pinned)
    r = cli(capsys, lab, "-l", ",".join(TARGETS), "models", "sync", str(spec), "--from", "lab1", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    repo_dir = f"{HUB}/models--{REPO.replace('/', '--')}"
    pinned_bytes = sum(p.stat().st_size for p in pinned.path.iterdir())
    assert pinned_bytes <= r.json()["source_bytes_sent"] <= 1.01 * pinned_bytes
    for host in TARGETS:
        blobs = {p.name for p in host_path(lab, host, f"{repo_dir}/blobs").iterdir()}
        assert blobs == blobs_of(pinned), host
        snapshot = host_path(lab, host, f"{repo_dir}/snapshots/{pinned.revision}")
        for entry in pinned.path.iterdir():
            link = snapshot / entry.name
            assert link.is_symlink() and os.readlink(link) == os.readlink(entry), (host, entry.name)
            assert link.read_bytes() == entry.read_bytes()
        assert sorted(p.name for p in host_path(lab, host, f"{repo_dir}/snapshots").iterdir()) == [pinned.revision]
        assert host_path(lab, host, f"{repo_dir}/refs/main").read_text() == pinned.revision
    check = cli(capsys, lab, "-l", ",".join(TARGETS), "models", "verify", str(spec), "--json")
    assert check.rc == 0, check.out[-3000:] + check.err
    for host in TARGETS:
        (state,) = check.json()["hosts"][host]["value"]
        assert (state["state"], state["hashed_bytes"]) == ("ok", 0), state
    again = cli(capsys, lab, "-l", ",".join(TARGETS), "models", "sync", str(spec), "--from", "lab1", "--json")
    assert again.rc == 0 and again.json()["source_bytes_sent"] == 0, again.out[-3000:]


def lock_file(lab: LabHandle, host: str, path: str) -> Path:
    return host_path(lab, host, f"{os.path.dirname(path)}/.{os.path.basename(path)}.fleetctl-partial.lock")


def test_a_second_sync_of_a_path_is_refused_while_the_first_holds_it(lab3: LabHandle,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    lab, path = lab3, "/srv/models/locked"
    clean(lab, path)
    want = folder_on_lab1(lab, path)
    first = start_sync(lab, path, "lab2", "--limit-rate", "1M", "--stall-timeout", "600")
    deadline = time.monotonic() + 300
    while not lock_file(lab, "lab2", path).exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    frozen = chain_nodes(lab, "lab2")
    assert frozen and first.poll() is None, first.communicate()
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)  # the first sync holds the path and cannot finish meanwhile
    try:
        second = cli(capsys, lab, "-l", "lab2", "models", "sync", path, "--from", "lab1", "--json")
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    assert second.rc == 2, second.out[-3000:] + second.err
    reason = second.json()["hosts"]["lab2"]["reason"]
    assert f"{path} is being synced by " in reason and f"pid {first.pid} " in reason, reason
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, out[-3000:] + err
    assert held(lab, "lab2", path) == want
    assert not lock_file(lab, "lab2", path).exists()  # released when the sync ended


def test_a_stale_lock_of_a_killed_sync_is_taken_over(lab3: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    lab, path = lab3, "/srv/models/stale"
    clean(lab, path)
    want = folder_on_lab1(lab, path)
    gone = lab.ssh("lab2", "sh -c 'echo $$'").stdout.strip()  # a pid no longer running on lab2
    lock = lock_file(lab, "lab2", path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"pid": int(gone), "pid_start": "1", "since": 0,
                                "holder": {"user": "root", "controller": "elsewhere", "pid": 1, "sync": "old"}}))
    r = cli(capsys, lab, "-l", "lab2", "models", "sync", path, "--from", "lab1", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert held(lab, "lab2", path) == want
    assert not lock.exists()


def start_sync(lab: LabHandle, path: str, host: str, *extra: str) -> subprocess.Popen[str]:
    code = "import sys; from fleetctl.cli.main import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "-i", str(lab.inventory_path), "-l", host, "models", "sync", path,
            "--from", "lab1", "--json", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT)


FAKE_HF = """#!/usr/bin/env python3
# A stand-in for huggingface_hub's `hf download REPO --revision REV --cache-dir CACHE`: no network; it
# copies the repo from /root/hf-origin (made by the test) and notes the token and argv it was given.
import os, shutil, sys
args = sys.argv[1:]
repo, rev, cache = args[1], args[args.index("--revision") + 1], args[args.index("--cache-dir") + 1]
open("/root/hf-seen", "w").write(repr((os.environ.get("HF_TOKEN"), sys.argv)))
folder = "models--" + repo.replace("/", "--")
src = os.path.join("/root/hf-origin", folder)
if not os.path.isdir(os.path.join(src, "snapshots", rev)):
    sys.exit("404 Client Error: revision %s not found" % rev)
shutil.copytree(src, os.path.join(cache, folder), symlinks=True, dirs_exist_ok=True)
"""


def vault_inventory(lab: LabHandle, tmp_path: Path, token: str, encrypted: bool) -> list[str]:
    """A copy of the lab inventory with lab1's hf_token in host_vars/ (a !vault value or plain text)."""
    inventory = user_inventory(lab, tmp_path / "inv.yml", user="root")
    (tmp_path / "host_vars").mkdir(exist_ok=True)
    (tmp_path / "pw").write_text("lab-vault-pw\n")
    if encrypted:
        body = vault_encrypt(token.encode(), b"lab-vault-pw").strip().replace("\n", "\n  ")
        (tmp_path / "host_vars" / "lab1.yml").write_text(f"hf_token: !vault |\n  {body}\n")
    else:
        (tmp_path / "host_vars" / "lab1.yml").write_text(f"hf_token: {token}\n")
    return ["-i", str(inventory), "--vault-password-file", str(tmp_path / "pw")]


def test_hf_download_on_the_seed_host_then_the_fleet_from_it(lab3: LabHandle, capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    lab, secret = lab3, "hf_labSECRETtoken0123456789"
    for host in lab.hosts:
        lab.ssh(host, f"rm -rf {HUB} /root/hf-origin /root/hf-seen")
    origin = make_hf_cache_model(host_path(lab, "lab1", "/root/hf-origin"), repo=REPO, seed="hub")
    fake = host_path(lab, "lab1", "/root/.local/bin/hf")
    fake.parent.mkdir(parents=True, exist_ok=True)
    fake.write_text(FAKE_HF)
    fake.chmod(0o755)
    spec = hf_spec(tmp_path, origin)
    plain = vault_inventory(lab, tmp_path, secret, encrypted=False)
    r = run_cli(capsys, *plain, "-l", ",".join(TARGETS), "models", "sync", str(spec), "--from", "lab1",
                "--hf-download")
    assert r.rc == 3 and "hf_token must be vault-encrypted" in r.err and secret not in r.out + r.err, r.err
    args = vault_inventory(lab, tmp_path, secret, encrypted=True)
    r = run_cli(capsys, *args, "-l", ",".join(TARGETS), "models", "sync", str(spec), "--from", "lab1",
                "--hf-download", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert "hf_download" in r.json()["phases"]
    assert secret not in r.out + r.err
    seen_token, seen_argv = eval(host_path(lab, "lab1", "/root/hf-seen").read_text())  # noqa: S307 - the test's own
    assert seen_token == secret  # by environment
    assert secret not in " ".join(seen_argv) and seen_argv[1:] == [
        "download", REPO, "--revision", origin.revision, "--cache-dir", HUB]
    for host in ["lab1", *TARGETS]:
        snapshot = host_path(lab, host, f"{HUB}/models--{REPO.replace('/', '--')}/snapshots/{origin.revision}")
        assert sorted(p.name for p in snapshot.iterdir()) == sorted(p.name for p in origin.path.iterdir()), host
        assert all(p.is_symlink() and p.read_bytes() == (origin.path / p.name).read_bytes()
                   for p in snapshot.iterdir()), host


def test_a_hugging_face_model_from_a_cache_on_the_controller(lab3: LabHandle, capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    lab = lab3
    for host in TARGETS:
        lab.ssh(host, f"rm -rf {HUB}")
    made = make_hf_cache_model(tmp_path / "cache", repo=REPO, seed="local")
    spec = hf_spec(tmp_path, made)
    r = cli(capsys, lab, "-l", ",".join(TARGETS), "models", "sync", str(spec), "--from", str(made.root), "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    for host in TARGETS:
        snapshot = host_path(lab, host, f"{HUB}/models--{REPO.replace('/', '--')}/snapshots/{made.revision}")
        assert {p.name: p.read_bytes() for p in snapshot.iterdir()} == {
            p.name: p.read_bytes() for p in made.path.iterdir()}, host


def test_a_sync_takes_away_the_staging_an_older_fleetctls_killed_sync_left_in_snapshots(
        lab3: LabHandle, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # An older fleetctl staged a snapshot in snapshots/.<revision>.fleetctl-partial (lock beside it); killed,
    # it left both, which huggingface_hub's scan lists as a revision / a corrupted repo. Planted on lab2 for
    # the revision being synced and on lab3 for another one; after this sync the Hub's scan sees the revision.
    from huggingface_hub import scan_cache_dir

    lab = lab3
    for host in TARGETS:
        lab.ssh(host, f"rm -rf {HUB}")
    made = make_hf_cache_model(tmp_path / "cache", repo=REPO, seed="old-staging")
    repo_dir = f"{HUB}/models--{REPO.replace('/', '--')}"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for host, revision in (("lab2", made.revision), ("lab3", "c" * 40)):
        staging = host_path(lab, host, f"{repo_dir}/snapshots/.{revision}.fleetctl-partial")
        (staging / ".fleetctl-tmp").mkdir(parents=True)
        (staging / ("e" * 64)).write_bytes(b"half a model")
        Path(f"{staging}.lock").write_text(json.dumps({"pid": gone.pid, "pid_start": "1", "since": 0}))
    spec = hf_spec(tmp_path, made)
    r = cli(capsys, lab, "-l", ",".join(TARGETS), "models", "sync", str(spec), "--from", str(made.root), "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    for host in TARGETS:
        scan = scan_cache_dir(host_path(lab, host, HUB))
        assert scan.warnings == [], (host, scan.warnings)
        assert [r.commit_hash for repo in scan.repos for r in repo.revisions] == [made.revision], host
