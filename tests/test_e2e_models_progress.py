"""``models verify --full`` on a terminal: while the hosts hash, the bytes hashed per host (rate, ETA) as
``models sync`` shows its bytes landed, from the hosts' progress frames; never in --json, never off a terminal,
and the answer unchanged. The real CLI under a pseudo-terminal (python's pty), against real lab sshd hosts.

The model is a 1 GiB safetensors shard whose tensor bytes are zeros (a sparse file on each host: no disk
for it, and sha256 still reads every byte), so the hash takes seconds even on a fast machine."""

from __future__ import annotations

import io
import json
import re
import shlex
import struct
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from test_playbook_step_tty import Tty

from fleetctl.models import manifest as mf

pytestmark = pytest.mark.lab
MODEL, SHARD, SIZE = "/srv/models/zeros", "model.safetensors", 1 << 30
HOSTS = ("lab1", "lab2")
HASHED = re.compile(r"(lab\d)\s*│\s*([\d,]+\.\d) / ([\d,]+\.\d) MB")


def header() -> bytes:
    """A safetensors header for one U8 tensor covering the rest of a SIZE-byte file."""
    room = 128  # the header's bytes, space-padded (8-aligned, as safetensors writes it)
    tensor = SIZE - 8 - room
    text = json.dumps({"zeros": {"dtype": "U8", "shape": [tensor], "data_offsets": [0, tensor]}}).encode()
    return struct.pack("<Q", room) + text.ljust(room)


@pytest.fixture(scope="module")
def zeros_model(lab_fleet: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The model on HOSTS; its bytes (what --full hashes)."""
    local = tmp_path_factory.mktemp("zeros") / "zeros"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    with (local / SHARD).open("wb") as shard:
        shard.write(header())
        shard.truncate(SIZE)  # sparse here too
    doc = mf.build_from_folder(local)
    mf.dump(doc, mf.manifest_path("folder", str(local)))
    with (local / SHARD).open("r+b") as shard:
        shard.truncate(len(header()))  # sent as its header alone; each host makes it whole (sparse)
    wire = io.BytesIO()
    with tarfile.open(fileobj=wire, mode="w") as tar:
        tar.add(local, arcname=".")
    for host in HOSTS:
        put = (f"rm -rf {MODEL} && mkdir -p {MODEL} && tar -C {MODEL} -xf - && "
               f"truncate -s {SIZE} {shlex.quote(MODEL + '/' + SHARD)}")
        subprocess.run(["ssh", *lab_fleet.ssh_options(), f"root@{lab_fleet.addresses[host]}", put],
                       input=wire.getvalue(), check=True, capture_output=True, timeout=120)
    yield doc.total_bytes
    for host in HOSTS:
        lab_fleet.ssh(host, "rm -rf /srv/models", check=False)


def cli_args(lab: LabHandle, *extra: str, hosts: tuple[str, ...] = HOSTS) -> list[str]:
    return ["-i", str(lab.inventory_path), "-l", ",".join(hosts), "models", "verify", MODEL, "--full", *extra]


def on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """The real CLI under a pseudo-terminal: its exit code and what it showed (escape codes stripped)."""
    tty = Tty(args, cwd)
    try:
        return tty.finish(timeout=300), tty.seen
    finally:
        if tty.proc.poll() is None:
            tty.proc.kill()
            tty.proc.wait()


def test_verify_full_shows_each_hosts_bytes_hashed_growing_on_a_terminal(lab_fleet: LabHandle, zeros_model: int,
                                                                        tmp_path: Path) -> None:
    rc, seen = on_a_terminal(cli_args(lab_fleet), tmp_path)
    assert rc == 0, seen
    assert re.search(r"host\s*┃\s*hashed\s*┃\s*rate\s*┃\s*eta", seen), seen
    shown: dict[str, list[float]] = {}
    for host, hashed, total in HASHED.findall(seen):
        assert float(total.replace(",", "")) == pytest.approx(zeros_model / 1e6, abs=0.1), seen
        shown.setdefault(host, []).append(float(hashed.replace(",", "")))
    for host in HOSTS:
        counts = shown.get(host) or []
        assert counts == sorted(counts), f"{host}'s bytes hashed went back: {counts}"
        assert len(set(counts)) >= 2, f"{host}: no growing byte count in {counts}\n{seen}"
    final = seen[seen.rindex("verified"):]  # the answer, after the display went away
    for host in HOSTS:
        assert re.search(rf"{host}\s*│\s*zeros\s*│[^\n]*│\s*ok\s*│\s*just now", final), final


def test_verify_full_json_on_a_terminal_is_the_json_document_alone(lab_fleet: LabHandle, zeros_model: int,
                                                                   tmp_path: Path) -> None:
    rc, seen = on_a_terminal(cli_args(lab_fleet, "--json", hosts=("lab1",)), tmp_path)
    assert rc == 0, seen
    doc = json.loads(seen)  # nothing but the document: no progress before, in or after it
    assert [(m["state"], m["hashed_bytes"]) for m in doc["hosts"]["lab1"]["value"]] == [("ok", zeros_model)]


def test_verify_full_off_a_terminal_shows_no_progress(lab_fleet: LabHandle, zeros_model: int,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, *cli_args(lab_fleet, hosts=("lab1",)))
    assert r.rc == 0, r.out + r.err
    assert "hashed" not in r.out + r.err and not HASHED.search(r.out + r.err)
    assert re.search(r"lab1\s*│\s*zeros\s*│[^\n]*│\s*ok\s*│", r.out), r.out
