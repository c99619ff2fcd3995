"""What a `models sync` of an older fleetctl left in a Hugging Face cache's snapshots/ when it was killed:
its staging folder (``.<revision>.fleetctl-partial/``, which huggingface_hub's scan_cache_dir lists as a
revision) and its lock file (a file in snapshots/, for which the scan drops the whole repo as corrupted).
Today's sync (its check on each target, under the path's sync lock) and ``models remove`` take them away,
and the real huggingface_hub's scan_cache_dir then lists the real revisions alone; an old staging that an
old sync still holds, and anything not ours by name, is left alone. The host-side code runs here as the
agent ships it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from huggingface_hub import scan_cache_dir
from model_support import MadeModel, make_hf_cache_model
from remote_support import remote_module

from fleetctl.liveness import process_start
from fleetctl.models.fanout import wire_files

FILES = remote_module("model_files")
HOST = remote_module("model_host")
OLD_REV = "b" * 40


def repo_dir(model: MadeModel) -> Path:
    return model.path.parent.parent


def gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def plant_old_staging(model: MadeModel, revision: str, pid: int, pid_start: Any) -> Path:
    """What the older sync left: its staging folder (a verified blob, a half-written temp) and its lock."""
    staging = repo_dir(model) / "snapshots" / f".{revision}.fleetctl-partial"
    (staging / ".fleetctl-tmp").mkdir(parents=True)
    (staging / ("e" * 64)).write_bytes(b"x" * 5000)
    (staging / ".fleetctl-tmp" / f"{'f' * 64}.{pid}.tmp").write_bytes(b"y" * 3000)
    lock = {"pid": pid, "pid_start": pid_start, "since": 0, "holder": {"command": f"models sync {staging}"}}
    Path(f"{staging}.lock").write_text(json.dumps(lock))
    return staging


def sync_check(model: MadeModel) -> dict[str, Any]:
    """A sync's check of ``model``'s snapshot on this 'host', as the controller asks it."""
    found = FILES.hf_source_manifest(str(model.root), model.repo, model.revision)
    files, links = wire_files(found["manifest"], found["blobs"])
    return dict(FILES.main({"action": "check", "layout": "hf_cache", "dest": str(model.path), "files": files,
                            "links": links, "manifest_name": ".fleetctl-manifest.json",
                            "holder": {"command": "models sync (test)", "sync": "t0k3n"}}))


def revisions(cache: Path) -> tuple[set[str], list[str]]:
    """What huggingface_hub's own scan finds: every repo's revisions, and its warnings."""
    info = scan_cache_dir(cache)
    return {r.commit_hash for repo in info.repos for r in repo.revisions}, [str(w) for w in info.warnings]


def test_the_hubs_scan_shows_what_an_old_killed_sync_left_as_a_phantom_revision_or_a_corrupted_repo(
        tmp_path: Path) -> None:
    # The harm being repaired, seen by the real huggingface_hub: the folder is listed as a revision...
    model = make_hf_cache_model(tmp_path / "hub")
    staging = plant_old_staging(model, OLD_REV, gone_pid(), "1")
    Path(f"{staging}.lock").unlink()
    assert revisions(tmp_path / "hub") == ({model.revision, staging.name}, [])
    # ...and with its lock file beside it the repo drops out of the scan as corrupted.
    plant_old_staging(model, "c" * 40, gone_pid(), "1")
    listed, warnings = revisions(tmp_path / "hub")
    assert listed == set() and len(warnings) == 1 and "Found a file" in warnings[0]


def test_a_sync_takes_away_what_an_older_fleetctls_killed_sync_left_in_snapshots(tmp_path: Path) -> None:
    model = make_hf_cache_model(tmp_path / "hub")
    staging = plant_old_staging(model, OLD_REV, gone_pid(), "1")
    snapshot_before = sorted(os.listdir(model.path))
    answer = sync_check(model)
    assert answer["complete"] is True  # the model there is untouched and still complete
    assert not staging.exists() and not Path(f"{staging}.lock").exists()
    assert sorted(os.listdir(repo_dir(model) / "snapshots")) == [model.revision]
    assert sorted(os.listdir(model.path)) == snapshot_before
    assert not os.path.exists(FILES.lock_path(str(model.path)))  # the check's own lock released
    assert revisions(tmp_path / "hub") == ({model.revision}, [])
    assert HOST.main({"op": "verify", "tier": "full", "cache_dir": str(tmp_path / "cache"), "models": [
        {"key": "m", "layout": "hf_cache", "cache": str(model.root), "repo": model.repo,
         "revision": model.revision}]})["models"][0]["state"] == "ok"


def test_an_old_staging_an_older_sync_still_holds_is_left_alone_and_so_is_what_is_not_ours(tmp_path: Path) -> None:
    model = make_hf_cache_model(tmp_path / "hub")
    live = plant_old_staging(model, OLD_REV, os.getpid(), process_start(os.getpid()))  # its node still runs
    snapshots = repo_dir(model) / "snapshots"
    not_ours = [snapshots / ".fleetctl-partial", snapshots / f"{'d' * 40}.fleetctl-partial",
                snapshots / f".{'d' * 40}.fleetctl-partial.old"]
    for path in not_ours:
        path.mkdir()
    sync_check(model)
    assert live.is_dir() and Path(f"{live}.lock").is_file()
    assert all(path.is_dir() for path in not_ours)
    assert (snapshots / model.revision).is_dir()


def test_the_old_staging_names_that_are_ours() -> None:
    ours = FILES.old_staging_of
    assert ours(f".{OLD_REV}.fleetctl-partial") == f".{OLD_REV}.fleetctl-partial"
    assert ours(f".{OLD_REV}.fleetctl-partial.lock") == f".{OLD_REV}.fleetctl-partial"
    assert ours(f".{OLD_REV}.fleetctl-partial.lock.4242.tmp") == f".{OLD_REV}.fleetctl-partial"
    for name in (OLD_REV, f"{OLD_REV}.fleetctl-partial", ".fleetctl-partial", f".{OLD_REV}.fleetctl-partial.x",
                 ".fleetctl", ".DS_Store", f".{OLD_REV}.fleetctl-partial.lock.4242"):
        assert ours(name) is None, name


def test_models_remove_takes_an_old_staging_with_the_snapshot(tmp_path: Path) -> None:
    model = make_hf_cache_model(tmp_path / "hub")
    staging = plant_old_staging(model, model.revision, gone_pid(), "1")  # an old sync of this very revision
    m = {"key": "m", "layout": "hf_cache", "cache": str(model.root), "repo": model.repo, "revision": model.revision}
    (tmp_path / "root" / "releases").mkdir(parents=True)
    out = HOST.main({"op": "remove", "root": str(tmp_path / "root"), "models": [m]})["models"][0]
    assert out["removed"] is True and sorted(out["swept"]) == [str(staging), f"{staging}.lock"]
    assert out["freed_bytes"] >= 5000 + 3000
    assert os.listdir(repo_dir(model) / "snapshots") == []
    assert revisions(tmp_path / "hub") == (set(), [])
