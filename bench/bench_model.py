"""A safetensors test model written for the models benches (random bytes, one tensor per shard)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path


def write_model(folder: Path, total: int, shards: int) -> int:
    """``shards`` safetensors shards of ``total`` bytes in all, the index and a config; the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    shard_bytes, weight_map = total // shards, {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        key = f"model.layers.{i}.weight"
        header = json.dumps({key: {"dtype": "U8", "shape": [shard_bytes], "data_offsets": [0, shard_bytes]}}).encode()
        with open(folder / name, "wb") as handle:
            handle.write(struct.pack("<Q", len(header)) + header)
            left = shard_bytes
            while left:
                block = os.urandom(min(left, 8 << 20))
                handle.write(block)
                left -= len(block)
        weight_map[key] = name
    index = {"metadata": {"total_size": shards * shard_bytes}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text('{"model_type": "bench"}\n')
    return sum(p.stat().st_size for p in folder.iterdir())
