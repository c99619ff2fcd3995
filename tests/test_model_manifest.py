"""Model manifests (fleetctl/models/manifest.py, fleetctl/remote/model_manifest.py) on test models made
with the safetensors package, both layouts: what a user would read in the manifest is the truth of the files."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from model_support import INDEX, flip_byte, make_folder_model, make_hf_cache_model

from fleetctl.models import manifest as mf


def test_folder_manifest_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    model = make_folder_model(tmp_path / "tiny", shards=3)
    m = mf.build_from_folder(model.path)
    paths = [f.path for f in m.files]
    assert paths == sorted([*model.shards, INDEX, "config.json", "special_tokens_map.json", "tokenizer.json",
                            "tokenizer_config.json"])
    for f in m.files:
        data = (model.path / f.path).read_bytes()
        assert f.size == len(data) and f.sha256 == hashlib.sha256(data).hexdigest()
    assert m.layout == "folder" and m.name == "tiny" and m.revision.startswith("sha256:")
    assert m.total_bytes == sum(os.path.getsize(model.path / p) for p in paths)


def test_folder_revision_is_the_content_and_changes_with_one_byte(tmp_path: Path) -> None:
    a = make_folder_model(tmp_path / "a")
    b = make_folder_model(tmp_path / "b")
    assert mf.build_from_folder(a.path).revision == mf.build_from_folder(b.path).revision
    flip_byte(b.path / b.shards[0])
    assert mf.build_from_folder(a.path).revision != mf.build_from_folder(b.path).revision


def test_dump_then_load_round_trips_and_the_manifest_is_not_part_of_the_model(tmp_path: Path) -> None:
    model = make_folder_model(tmp_path / "m")
    m = mf.build_from_folder(model.path)
    where = mf.manifest_path("folder", str(model.path))
    assert where == str(model.path / ".fleetctl-manifest.json")
    mf.dump(m, where)
    assert mf.load(where) == m
    assert mf.build_from_folder(model.path) == m  # the manifest file itself is not listed


def test_hf_cache_manifest_takes_sha256_from_blob_names_and_hashes_git_blobs(tmp_path: Path) -> None:
    model = make_hf_cache_model(tmp_path / "hub", repo="org/tiny")
    assert model.revision and len(model.revision) == 40
    assert (tmp_path / "hub/models--org--tiny/refs/main").read_text() == model.revision
    link = model.path / model.shards[0]
    assert link.is_symlink() and os.readlink(link).startswith("../../blobs/")
    m = mf.build_from_hf_cache(model.root, "org/tiny", model.revision)
    assert (m.layout, m.repo, m.revision, m.name) == ("hf_cache", "org/tiny", model.revision, "org/tiny")
    files = m.by_path()
    for rel, f in files.items():
        data = (model.path / rel).read_bytes()
        assert f.sha256 == hashlib.sha256(data).hexdigest()
        blob = os.path.basename(os.readlink(model.path / rel))
        assert (f.git_sha1 == blob) if len(blob) == 40 else (f.git_sha1 is None and blob == f.sha256)
    assert files["config.json"].git_sha1 is not None and files[model.shards[0]].git_sha1 is None
    where = mf.manifest_path("hf_cache", str(model.root), "org/tiny", model.revision)
    assert where == str(tmp_path / f"hub/models--org--tiny/.fleetctl/{model.revision}.manifest.json")
    mf.dump(m, where)
    assert mf.load(where) == m


def test_hf_cache_manifest_trusts_the_blob_name_full_verification_is_what_proves_it(tmp_path: Path) -> None:
    model = make_hf_cache_model(tmp_path / "hub")
    assert model.repo and model.revision
    flip_byte(model.path / model.shards[0])
    m = mf.build_from_hf_cache(model.root, model.repo, model.revision)
    data = (model.path / model.shards[0]).read_bytes()
    assert m.by_path()[model.shards[0]].sha256 != hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("doc, says", [
    ("{", "not valid JSON"),
    (json.dumps({"schema": "x"}), "not a fleetctl model manifest"),
    (json.dumps({"schema": "fleetctl-model-manifest/1", "name": "n", "revision": "r", "layout": "zip",
                 "files": []}), "layout must be one of"),
    (json.dumps({"schema": "fleetctl-model-manifest/1", "name": "n", "revision": "r", "layout": "folder",
                 "files": [{"path": "../etc/passwd", "size": 1, "sha256": "0" * 64}]}), "files[0] needs a relative"),
])
def test_a_bad_manifest_is_one_line_naming_the_file(tmp_path: Path, doc: str, says: str) -> None:
    where = tmp_path / ".fleetctl-manifest.json"
    where.write_text(doc)
    with pytest.raises(mf.ManifestError) as err:
        mf.load(where)
    assert str(where) in str(err.value) and says in str(err.value) and "\n" not in str(err.value)
