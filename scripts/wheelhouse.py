#!/usr/bin/env python3
"""The full SGLang environment's wheels, pinned by a lock and cached outside the checkout.

  wheelhouse.py fetch LOCK DEST   every wheel LOCK pins, in DEST, each checked against its hash;
                                  only the missing or damaged ones are downloaded (pip, --require-hashes)
  wheelhouse.py lock FOLDER LOCK  write LOCK from a folder that `pip download` resolved (see RESOLVE)

Stdlib only: it runs before the project's venv exists. DEST is shared by every checkout on the
machine (default /var/cache/fleetctl-wheels/<lock name>, visible inside the lab hosts, which have
private /root, /opt, /srv but not /var/cache); concurrent fetches serialise on DEST/.lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PYTHON_VERSION, ABI = "3.11", "cp311"
# manylinux_2_34 (sglang 0.5.23's own wheel) and every older glibc tag: pip 23 does not widen a
# single --platform to older ones, and the closure's wheels carry 2_17 .. 2_34 tags.
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(34, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
TARGET = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp",
          "--abi", ABI, "--abi", "abi3", "--abi", "none"] + [a for p in PLATFORMS for a in ("--platform", p)]
RESOLVE = ("pip download sglang==0.5.23 -d FOLDER " + " ".join(TARGET[:11])
           + " --platform manylinux_2_{34..5}_x86_64 ...")
LINE = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)\s+--hash=sha256:([0-9a-f]{64})\s+#\s*(\S+\.whl)\s*$")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_lock(lock: Path) -> list[tuple[str, str, str, str]]:
    """(name, version, sha256, wheel file name) of every pin."""
    out = []
    for number, raw in enumerate(lock.read_text().splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        found = LINE.match(raw)
        if not found:
            raise SystemExit(f"{lock}:{number}: expected 'name==version --hash=sha256:HEX  # file.whl'")
        out.append(found.groups())  # type: ignore[arg-type]
    return out


def write_lock(folder: Path, lock: Path) -> None:
    rows = []
    for whl in sorted(folder.glob("*.whl"), key=lambda p: p.name.lower()):
        name, version = whl.name.split("-")[:2]
        rows.append(f"{name.replace('_', '-').lower()}=={version} --hash=sha256:{sha256(whl)}  # {whl.name}")
    head = [f"# sglang 0.5.23 and its whole closure for CPython {PYTHON_VERSION} on manylinux x86_64: "
            f"{len(rows)} distributions.", f"# Resolved with: {RESOLVE}",
            "# Fetched into a shared cache by: python3 scripts/wheelhouse.py fetch THIS_FILE DEST"]
    lock.write_text("\n".join(head + rows) + "\n")
    print(f"{lock}: {len(rows)} pins")


def fetch(lock: Path, dest: Path) -> None:
    started = time.monotonic()
    pins = read_lock(lock)
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / ".lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        missing = [p for p in pins if not ok(dest / p[3], p[2])]
        if missing:
            print(f"wheelhouse {dest}: downloading {len(missing)} of {len(pins)} wheels", flush=True)
            with tempfile.TemporaryDirectory(dir=dest, prefix=".dl-") as tmp:
                req = Path(tmp) / "req.txt"
                req.write_text("".join(f"{n}=={v} --hash=sha256:{h}\n" for n, v, h, _f in missing))
                subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                                "--no-deps", "--require-hashes", *TARGET, "-r", str(req), "-d", tmp], check=True)
                for _n, _v, want, name in missing:
                    got = Path(tmp) / name
                    if not ok(got, want):
                        raise SystemExit(f"wheelhouse: {name} missing or not sha256 {want} after the download")
                    os.replace(got, dest / name)
        stray = sorted(set(p.name for p in dest.glob("*.whl")) - {p[3] for p in pins})
    size = sum((dest / p[3]).stat().st_size for p in pins)
    print(f"wheelhouse {dest}: {len(pins)} wheels, {size / 1e9:.1f} GB, checked against {lock.name} "
          f"in {time.monotonic() - started:.1f} s" + (f" ({len(stray)} other wheels left alone)" if stray else ""))


def ok(path: Path, want: str) -> bool:
    """The wheel is there with the lock's hash; the verdict is kept beside it (by size, mtime,
    inode) so a second fetch reads no 4 GB."""
    try:
        st = path.stat()
    except OSError:
        return False
    stamp = path.with_name(f".{path.name}.sha256")
    key = f"{st.st_size} {st.st_mtime_ns} {st.st_ino} {want}"
    try:
        if stamp.read_text() == key:
            return True
    except OSError:
        pass
    if sha256(path) != want:
        return False
    stamp.write_text(key)
    return True


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[0] == "fetch":
        fetch(Path(argv[1]), Path(argv[2]))
    elif len(argv) == 3 and argv[0] == "lock":
        write_lock(Path(argv[1]), Path(argv[2]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
