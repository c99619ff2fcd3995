"""The overlay's stream processes answer the listing calls before their work (issue 37: a fresh
overlay lists each host over the process that then carries its files, no agent and no second
description of the source), run here as the controller runs them, without any host."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path
from typing import Any

from fleetctl.overlay import calls
from fleetctl.overlay import stream as stream


def sha(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def frame(doc: Any) -> bytes:
    body = json.dumps(doc).encode()
    return struct.pack(">I", len(body)) + body


class Process:
    """A remote module's stream command under ``python``, fed and read as the controller does."""

    def __init__(self, module: str, python: str) -> None:
        self.proc = subprocess.Popen(["sh", "-c", stream.stream_command(module, python)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def call(self, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(frame({"call": params}))
        self.proc.stdin.flush()
        magic = self.proc.stdout.read(len(calls.CALL_MAGIC))
        assert magic == calls.CALL_MAGIC, magic + self.proc.stdout.read() + self.proc.communicate()[1]
        size = struct.unpack(">I", self.proc.stdout.read(4))[0]
        answer: dict[str, Any] = json.loads(self.proc.stdout.read(size))
        return answer


def tiny_venv(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    files = {"tiny/__init__.py": b"X = 1\n", "tiny/data.txt": b"hello\n",
             "tiny-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n"}
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    rows = [f"{rel},sha256={sha(data)},{len(data)}" for rel, data in files.items()] + ["tiny-1.0.dist-info/RECORD,,"]
    (site / "tiny-1.0.dist-info" / "RECORD").write_text("\n".join(rows) + "\n")
    return venv, site, files


def test_the_source_process_lists_then_gives_file_lists_then_sends_on_one_connection(tmp_path: Path) -> None:
    """The listing (no file lists), then the file lists of what a target lacks, then the tar of
    those files, all from one process; a bad call is answered with its error and the process goes
    on. A change to a file after the listing does not change the file lists it gives (they are what
    it listed: the target's hash check refuses what then arrives different)."""
    venv, site, files = tiny_venv(tmp_path)
    src = Process("overlay_source", str(venv / "bin" / "python"))
    ask = {"action": "list", "packages": [], "target_prefix": "/t", "cache_dir": str(tmp_path / "cache")}
    listed = src.call({**ask, "files_for": []})
    assert listed["ok"] is True, listed
    (dist,) = listed["result"]["dists"]
    assert dist["name"] == "tiny" and "files_z" not in dist
    bad = src.call({"action": "nothing"})
    assert bad["ok"] is False and bad["error"]["type"] == "ValueError", bad
    (site / "tiny" / "data.txt").write_bytes(b"changed after the listing\n")
    detail = src.call({**ask, "files_for": ["tiny"]})
    (again,) = detail["result"]["dists"]
    got = json.loads(zlib.decompress(base64.b64decode(again["files_z"])))["files"]
    assert {f[0]: f[1] for f in got}["tiny/data.txt"] == sha(b"hello\n") and again["tree"] == dist["tree"]
    (site / "tiny" / "data.txt").write_bytes(files["tiny/data.txt"])
    assert src.proc.stdin is not None and src.proc.stdout is not None
    send = [["tiny-1.0.dist-info", rel] for rel in files]
    src.proc.stdin.write(frame({"send": send, "target_prefix": "/t", "level": 0}))
    src.proc.stdin.close()
    out = src.proc.stdout.read()
    assert src.proc.wait(timeout=60) == 0, src.proc.communicate()[1]
    raw, payload = out.split(stream.STREAM_MAGIC, 1)[1], bytearray()
    while (size := struct.unpack(">I", raw[:4])[0]) != 0:
        payload += raw[4:4 + size]
        raw = raw[4 + size:]
    with tarfile.open(fileobj=io.BytesIO(bytes(payload)), mode="r|") as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar} == files  # type: ignore[union-attr]


def test_a_process_asked_nothing_more_exits_quietly_and_a_missing_python_says_so(tmp_path: Path) -> None:
    """The end of its input after the listing (a dry run, nothing to change) ends the process with
    nothing written; a venv without its python is one line the controller recognises."""
    venv, _site, _files = tiny_venv(tmp_path)
    target = Process("overlay_target", str(venv / "bin" / "python"))
    own = target.call({"action": "list", "own_trees": True, "packages": [], "cache_dir": str(tmp_path / "c"),
                       "state_dir": str(tmp_path / "s")})
    assert own["ok"] is True and list(own["result"]["dists"]) == ["tiny"], own
    out, err = target.proc.communicate(timeout=60)
    assert (target.proc.returncode, out, err) == (0, b"", b"")
    missing = Process("overlay_target", str(tmp_path / "none" / "bin" / "python"))
    out, err = missing.proc.communicate(timeout=60)
    assert missing.proc.returncode == 127 and out == b""
    assert err.decode().strip() == f"{calls.NO_PYTHON}: no python at {tmp_path / 'none' / 'bin' / 'python'}"


def test_a_large_binarys_digest_is_read_in_chunks_and_a_text_small_or_missing_file_has_none(tmp_path: Path) -> None:
    """The listing hashes a large binary from the file (it is sent as it is); a text file may be
    relocated and a small one is read whole, so neither has a digest here, and a file that cannot be
    opened has none either (read whole later, which says it is missing), not an error mid-listing."""
    from fleetctl.transport.agent import module_source

    ns: dict[str, Any] = {"__name__": "fleetctl_remote_test"}
    exec(compile(module_source("overlay_read")[0], "overlay_read", "exec"), ns)  # noqa: S102 - our own host-side code
    big = b"\x7fELF\0" + bytes(range(256)) * (5 << 12)
    (tmp_path / "lib.so").write_bytes(big)
    (tmp_path / "big.py").write_bytes(b"x = 1\n" * (1 << 18))
    (tmp_path / "small.so").write_bytes(b"\0" * 100)
    assert ns["binary_digest"](str(tmp_path / "lib.so"), len(big)) == (sha(big), len(big))
    assert ns["binary_digest"](str(tmp_path / "big.py"), 6 << 18) is None
    assert ns["binary_digest"](str(tmp_path / "small.so"), 100) is None
    assert ns["binary_digest"](str(tmp_path / "gone.so"), len(big)) is None
