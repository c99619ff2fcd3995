"""Verification tiers on the host (fleetctl/remote/model_host.py, run as the agent ships it) over real
safetensors test models: quick names a truncated shard, a broken header or index, a dangling symlink;
a same-size byte flip passes quick and is caught by the rehash of changed files, and by full."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from model_support import INDEX, MadeModel, flip_byte, make_folder_model, make_hf_cache_model, truncate
from remote_support import remote_module

from fleetctl.models import manifest as mf

HOST = remote_module("model_host")


def params(model: MadeModel) -> dict[str, Any]:
    if model.layout == "folder":
        return {"key": "main", "layout": "folder", "path": str(model.path)}
    return {"key": "main", "layout": "hf_cache", "cache": str(model.root), "repo": model.repo,
            "revision": model.revision}


def verify(model: MadeModel, tier: str, cache: Path) -> dict[str, Any]:
    answer = HOST.main({"op": "verify", "tier": tier, "cache_dir": str(cache), "models": [params(model)]})
    return dict(answer["models"][0])


def folder_with_manifest(tmp_path: Path, **kw: Any) -> MadeModel:
    model = make_folder_model(tmp_path / "m", **kw)
    mf.dump(mf.build_from_folder(model.path), mf.manifest_path("folder", str(model.path)))
    return model


def test_quick_on_an_intact_model_is_ok_in_both_layouts(tmp_path: Path) -> None:
    for model in (folder_with_manifest(tmp_path), make_hf_cache_model(tmp_path / "hub")):
        out = verify(model, "quick", tmp_path / "cache")
        assert (out["state"], out["problems"], out["present"], out["manifest"]) == ("ok", [], True, True)
        assert out["bytes"] == sum(os.path.getsize(model.path / f) for f in os.listdir(model.path)
                                   if not f.startswith("."))
        assert out["free_bytes"] > 0 and out["hashed_bytes"] == 0 and out["verified_at"] is None


def test_a_truncated_shard_is_named_by_quick(tmp_path: Path) -> None:
    model = folder_with_manifest(tmp_path)
    truncate(model.path / model.shards[1])
    out = verify(model, "quick", tmp_path / "cache")
    assert out["state"] == "incomplete"
    assert [(p["file"], "truncated" in p["what"]) for p in out["problems"]] == [(model.shards[1], True)]


def test_quick_checks_headers_even_without_a_manifest(tmp_path: Path) -> None:
    model = make_folder_model(tmp_path / "m")
    truncate(model.path / model.shards[0], 100)
    problems = {p["file"]: p for p in verify(model, "quick", tmp_path / "cache")["problems"]}
    assert problems[".fleetctl-manifest.json"]["kind"] == "unverified"
    assert "truncated" in problems[model.shards[0]]["what"]


def test_a_damaged_header_of_the_right_size_is_corrupt(tmp_path: Path) -> None:
    model = folder_with_manifest(tmp_path)
    flip_byte(model.path / model.shards[0], offset=8)  # the header's opening brace
    out = verify(model, "quick", tmp_path / "cache")
    assert out["state"] == "corrupt" and out["problems"][0]["file"] == model.shards[0]
    assert "not JSON" in out["problems"][0]["what"]


def test_an_index_naming_an_absent_shard_is_incomplete(tmp_path: Path) -> None:
    model = make_folder_model(tmp_path / "m")
    index = json.loads((model.path / INDEX).read_text())
    index["weight_map"]["lm_head.weight"] = "model-00009-of-00009.safetensors"
    (model.path / INDEX).write_text(json.dumps(index))
    mf.dump(mf.build_from_folder(model.path), mf.manifest_path("folder", str(model.path)))
    out = verify(model, "quick", tmp_path / "cache")
    assert [(p["file"], p["kind"]) for p in out["problems"]] == [("model-00009-of-00009.safetensors", "corrupt")]
    assert "absent" in out["problems"][0]["what"]


def test_a_dangling_snapshot_symlink_is_named(tmp_path: Path) -> None:
    model = make_hf_cache_model(tmp_path / "hub")
    os.unlink(os.path.realpath(model.path / model.shards[0]))
    out = verify(model, "quick", tmp_path / "cache")
    assert out["state"] == "incomplete"
    assert out["problems"][0]["file"] == model.shards[0] and "dangling symlink" in out["problems"][0]["what"]


def test_a_same_size_flip_passes_quick_and_the_deploy_tier_rehashes_only_what_changed(tmp_path: Path) -> None:
    model = folder_with_manifest(tmp_path, shards=3)
    cache = tmp_path / "cache"
    first = verify(model, "deploy", cache)  # never hashed here: every file hashed once
    assert first["state"] == "ok" and first["hashed_bytes"] == first["bytes"] and first["verified_at"]
    again = verify(model, "deploy", cache)
    assert again["state"] == "ok" and again["hashed_bytes"] == 0 and again["verified_at"] == first["verified_at"]
    victim = model.path / model.shards[2]
    flip_byte(victim)
    assert verify(model, "quick", cache)["state"] == "ok"  # size and header unchanged: quick cannot see it
    out = verify(model, "deploy", cache)
    assert out["hashed_bytes"] == victim.stat().st_size  # only the changed file read again
    assert [(p["file"], p["kind"]) for p in out["problems"]] == [(model.shards[2], "corrupt")]
    assert out["verified_at"] is None
    assert verify(model, "full", cache)["problems"] == out["problems"]


def test_a_flipped_lfs_blob_in_the_hf_cache_is_caught_by_full(tmp_path: Path) -> None:
    model = make_hf_cache_model(tmp_path / "hub")
    flip_byte(model.path / model.shards[0])
    out = verify(model, "full", tmp_path / "cache")
    assert [(p["file"], p["kind"]) for p in out["problems"]] == [(model.shards[0], "corrupt")]


def test_header_check_matches_the_format(tmp_path: Path) -> None:
    model = make_folder_model(tmp_path / "m")
    shard = model.path / model.shards[0]
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    assert HOST.safetensors_problem(str(shard), len(data))[0] is None
    shard.write_bytes(data + b"\0")
    assert "trailing bytes" in HOST.safetensors_problem(str(shard), len(data) + 1)[0]
    shard.write_bytes(data[:8 + n - 1])
    assert "does not fit" in HOST.safetensors_problem(str(shard), 8 + n - 1)[0]


def test_remove_refuses_a_model_a_kept_release_names(tmp_path: Path) -> None:
    model = folder_with_manifest(tmp_path)
    root = tmp_path / "opt"
    (root / "releases/r1").mkdir(parents=True)
    (root / "releases/r1/service.json").write_text(json.dumps({"command": ["py", "--model-path", str(model.path)]}))
    try:
        HOST.main({"op": "remove", "root": str(root), "models": [params(model)]})
        raise AssertionError("removed")
    except ValueError as exc:
        assert "kept release r1" in str(exc)
    assert model.path.is_dir()
    (root / "releases/r1/service.json").unlink()
    answer = HOST.main({"op": "remove", "root": str(root), "models": [params(model)]})
    assert answer["models"][0]["removed"] and not model.path.exists()


def test_remove_of_a_snapshot_keeps_blobs_another_snapshot_links(tmp_path: Path) -> None:
    a = make_hf_cache_model(tmp_path / "hub", repo="o/m")
    b = make_hf_cache_model(tmp_path / "hub", repo="o/m", shards=3)
    assert a.revision != b.revision
    HOST.main({"op": "remove", "root": str(tmp_path / "opt"), "models": [params(a)]})
    assert not a.path.exists()
    assert verify(b, "full", tmp_path / "cache")["state"] == "ok"


def test_a_damaged_small_blob_is_named_against_its_git_sha1(tmp_path: Path) -> None:
    model = make_hf_cache_model(tmp_path / "hub")
    config = Path(os.path.realpath(model.path / "config.json"))
    config.write_bytes(config.read_bytes().replace(b"qwen3", b"qwen2"))  # same size, other bytes
    out = verify(model, "quick", tmp_path / "cache")  # no manifest kept: derived from the blob names
    assert [(p["file"], p["kind"]) for p in out["problems"]] == [("config.json", "corrupt")]
    assert "its blob name says" in out["problems"][0]["what"]


def test_remove_refuses_a_folder_holding_a_model_a_kept_release_names(tmp_path: Path) -> None:
    model = folder_with_manifest(tmp_path)
    root = tmp_path / "opt"
    (root / "releases/r1").mkdir(parents=True)
    (root / "releases/r1/service.json").write_text(json.dumps({"models": {"main": {"path": str(model.path)}}}))
    (model.path.parent / "config.json").write_text("{}")  # the parent looks like a model too
    parent = {"key": "all", "layout": "folder", "path": str(model.path.parent)}
    try:
        HOST.main({"op": "remove", "root": str(root), "models": [parent]})
        raise AssertionError("removed")
    except ValueError as exc:
        assert f"{model.path} is used by kept release r1" in str(exc)
    assert model.path.is_dir()


def rewrite_header(shard: Path, change: Any) -> None:
    """The shard's header JSON changed by ``change`` and padded with spaces to its old length (the
    format allows trailing spaces), so the file keeps its size and its spans still tile it."""
    data = shard.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    change(header)
    raw = json.dumps(header, separators=(",", ":")).encode()
    assert len(raw) <= n
    shard.write_bytes(data[:8] + raw + b" " * (n - len(raw)) + data[8 + n:])


def test_a_shape_that_disagrees_with_its_bytes_is_named_as_safetensors_itself_refuses_it(tmp_path: Path) -> None:
    from safetensors import safe_open

    model = make_folder_model(tmp_path / "m")
    shard = model.path / model.shards[0]
    name = next(k for k in json.loads(shard.read_bytes()[8:8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]])
                if k != "__metadata__")

    def halve_first_dim(header: dict[str, Any]) -> None:
        shape = header[name]["shape"]
        assert shape[0] % 2 == 0
        shape[0] //= 2

    rewrite_header(shard, halve_first_dim)
    what = HOST.safetensors_problem(str(shard), shard.stat().st_size)[0]
    assert what is not None and f"tensor {name} is" in what and "damaged" in what
    try:
        with safe_open(str(shard), framework="numpy") as handle:
            handle.get_tensor(name)
    except Exception as exc:  # the real loader's own verdict on the same file
        assert "invalid" in str(exc).lower() or "mismatch" in str(exc).lower(), exc
    else:
        raise AssertionError("safetensors loaded a tensor whose shape disagrees with its bytes")


def test_an_unknown_dtype_is_not_judged_but_its_span_still_is(tmp_path: Path) -> None:
    model = make_folder_model(tmp_path / "m")
    shard = model.path / model.shards[0]
    data = shard.read_bytes()
    header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
    name = next(k for k in header if k != "__metadata__")
    rewrite_header(shard, lambda h: h[name].update(dtype="F2_FUTURE"))
    assert HOST.safetensors_problem(str(shard), shard.stat().st_size)[0] is None


def test_a_hf_snapshot_is_staged_outside_snapshots_where_the_hubs_own_tools_would_list_it(tmp_path: Path) -> None:
    # huggingface_hub 1.33's scan_cache_dir (behind `hf cache ls` and `hf cache rm`) lists every folder in
    # snapshots/ as a revision, a hidden one too: a staging folder there is a phantom revision mid-sync.
    files = remote_module("model_files")
    repo = tmp_path / "hub" / "models--org--name"
    dest = str(repo / "snapshots" / ("a" * 40))
    for path in (files.staging_of(dest), files.temp_dir_of(dest), files.lock_path(dest)):
        assert Path(path).is_relative_to(repo / ".fleetctl"), path
    folder = str(tmp_path / "models" / "qwen")  # a plain folder keeps its staging beside it
    assert files.staging_of(folder) == str(tmp_path / "models" / ".qwen.fleetctl-partial")


def test_the_hash_tiers_send_progress_frames_through_the_agent_and_the_answer_is_the_same(tmp_path: Path) -> None:
    # A real agent on this machine: the frames come before the answer, bytes hashed growing to the total
    # the tier reads; asked or not, the same answer; the agent's framing intact for the next request.
    from fleetctl.transport.agent import AgentClient
    from fleetctl.transport.local import LocalConnector

    model = folder_with_manifest(tmp_path, shards=3, tensor_kib=4096)  # 12 MiB per shard: several chunks
    request = {"op": "verify", "tier": "full", "cache_dir": str(tmp_path / "cache"), "models": [params(model)]}
    agent = AgentClient("local", LocalConnector("local"), ["/usr/bin/python3"])
    try:
        frames: list[dict[str, Any]] = []
        shown = agent.call("model_host", request, progress=frames.append)["models"][0]
        plain = agent.call("model_host", request)["models"][0]
        deploy: list[dict[str, Any]] = []
        agent.call("model_host", {**request, "tier": "deploy"}, progress=deploy.append)  # nothing changed
        assert agent.call("selftest", {"action": "echo", "data": 1})["echo"] == 1
    finally:
        agent.close()
    total = shown["bytes"]
    assert frames[0] == {"bytes": 0, "total": total} and frames[-1] == {"bytes": total, "total": total}
    counts = [f["bytes"] for f in frames]
    assert counts == sorted(counts) and {f["total"] for f in frames} == {total}
    assert (shown["state"], shown["hashed_bytes"], shown["problems"]) == (plain["state"], total, plain["problems"])
    assert plain["hashed_bytes"] == total and deploy == []  # the deploy tier had nothing to hash: no frames
