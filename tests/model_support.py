"""Test models made here, nothing fetched from the Hub: real safetensors shards (written by the
``safetensors`` package), ``model.safetensors.index.json``, ``config.json`` and tokenizer files, in both
layouts a host holds a model in: a plain folder, and a Hugging Face cache
(``models--ORG--NAME/{blobs,refs/main,snapshots/<40-hex>}``, LFS blobs named by sha256, small files by
git-sha1, snapshot entries relative symlinks into ``blobs/``)."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from safetensors import TensorSpec, serialize_file

SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class MadeModel:
    """Where a made model is: ``path`` is what a server is given (the folder or the snapshot)."""

    layout: str  # "folder" | "hf_cache"
    path: Path
    shards: tuple[str, ...]
    root: Path  # the folder, or the cache
    repo: str | None = None
    revision: str | None = None


def shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def _tensor_bytes(seed: str, size: int) -> bytes:
    """Deterministic, non-repeating bytes (a flipped byte anywhere changes the hash)."""
    out = bytearray()
    block = hashlib.sha256(seed.encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:size])


def write_files(folder: Path, shards: int = 2, tensors_per_shard: int = 3, tensor_kib: int = 64,
                seed: str = "fleetctl") -> tuple[str, ...]:
    """The model's files in ``folder``: shards, index, config and tokenizer files. Returns the shard names."""
    folder.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    names = tuple(shard_name(i + 1, shards) for i in range(shards))
    for s, shard in enumerate(names):
        tensors, buffers = {}, []  # buffers: alive while serialize_file reads them by pointer
        for t in range(tensors_per_shard):
            key = f"model.layers.{s * tensors_per_shard + t}.mlp.weight"
            data = _tensor_bytes(f"{seed}/{key}", tensor_kib * 1024)
            buffers.append(ctypes.create_string_buffer(data, len(data)))
            tensors[key] = TensorSpec(dtype="float32", shape=[tensor_kib * 256], data_ptr=ctypes.addressof(buffers[-1]),
                                      data_len=len(data))
            weight_map[key] = shard
            total += len(data)
        serialize_file(tensors, str(folder / shard), metadata={"format": "pt"})
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                                     "hidden_size": 64, "_seed": seed}, indent=2))
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "Qwen2Tokenizer"}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return names


def make_folder_model(folder: Path, **kw: object) -> MadeModel:
    shards = write_files(folder, **kw)  # type: ignore[arg-type]
    return MadeModel("folder", folder, shards, folder)


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_hf_cache_model(cache: Path, repo: str = "fleetctl-test/tiny-moe", **kw: object) -> MadeModel:
    """The model as huggingface_hub leaves it in ``cache`` after a download of one revision."""
    staging = cache / f".staging-{repo.replace('/', '--')}"
    shards = write_files(staging, **kw)  # type: ignore[arg-type]
    files = sorted(p.name for p in staging.iterdir())
    revision = hashlib.sha1("".join(files).encode() + (staging / INDEX).read_bytes()
                            + (staging / "config.json").read_bytes()).hexdigest()
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    blobs, snapshot = repo_dir / "blobs", repo_dir / "snapshots" / revision
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name in files:
        data = (staging / name).read_bytes()
        blob = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_sha1(data)
        os.replace(staging / name, blobs / blob)
        link = snapshot / name
        if link.is_symlink():
            link.unlink()
        link.symlink_to(f"../../blobs/{blob}")
    staging.rmdir()
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return MadeModel("hf_cache", snapshot, shards, cache, repo, revision)


def flip_byte(path: Path, offset: int | None = None) -> None:
    """One byte changed in place, the size kept (as ``dd conv=notrunc`` does): in the tensor data by default."""
    real = Path(os.path.realpath(path))
    with real.open("r+b") as handle:
        if offset is None:
            (n,) = struct.unpack("<Q", handle.read(8))
            offset = 8 + n + 17
        handle.seek(offset)
        old = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([old[0] ^ 0xFF]))


def truncate(path: Path, cut: int = 1024) -> None:
    real = Path(os.path.realpath(path))
    os.truncate(real, real.stat().st_size - cut)
