"""Each interpreter's version in `facts` is asked once per binary (fleetctl/remote/python_versions.py):
a kept agent and a later run answer an unchanged binary without running it; a replaced or rewritten
binary is run again and its new version reported. Real interpreters, run for real; each run of one is
counted by a sitecustomize that appends to a log."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from interpreters import find_python
from remote_support import remote_module

SYSTEM_PYTHON = "/usr/bin/python3"


def _version(python: str) -> str:
    return subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _elf_python() -> str:
    """A real ELF interpreter of this machine (the one running the tests, followed to its file)."""
    for candidate in (SYSTEM_PYTHON, sys.executable):
        real = os.path.realpath(candidate)
        if os.path.exists(real) and Path(real).read_bytes()[:4] == b"\x7fELF":
            return real
    raise AssertionError("no ELF python on this machine")


def _other_python(than: str) -> str | None:
    """An interpreter of another version than ``than`` (a real binary), where this machine has one."""
    for version in ("3.12", "3.13", "3.10", "3.9", "3.8"):
        found = find_python(version)
        if found and not _version(found).startswith(than.rsplit(".", 1)[0] + "."):
            return os.path.realpath(found)
    return None


class Host:
    """A PATH of one folder holding ``python3`` (a copy of a real interpreter), every run of a Python
    logged, and facts' host module loaded as a fresh (``kept=False``) or kept agent loads it."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin, self.cache, self.log = tmp_path / "bin", tmp_path / "cache", tmp_path / "runs.log"
        self.bin.mkdir()
        site = tmp_path / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(
            f"import os, sys\nwith open({str(self.log)!r}, 'a') as f:\n"
            "    f.write(os.environ.get('RUN_TAG', sys.executable) + '\\n')\n")
        monkeypatch.setenv("PYTHONPATH", str(site))
        monkeypatch.setenv("PATH", str(self.bin))
        self.memo: dict[Any, Any] = {}
        self.settle_s = 0.0  # the files here were all changed just now: remember them at once
        self.python = str(self.bin / "python3")

    def install(self, source: str) -> None:
        """``source`` copied in as bin/python3 and renamed over the old one (a package upgrade's way)."""
        tmp = self.bin / ".python3.new"
        shutil.copy2(source, tmp)
        os.replace(tmp, self.python)

    def facts(self, *, kept: bool) -> dict[str, Any]:
        module: ModuleType = remote_module("facts")
        module.SETTLE_S = self.settle_s  # type: ignore[attr-defined]
        if kept:
            module.AGENT_MEMO = self.memo  # type: ignore[attr-defined]  # as the agent's namespace has it
        found = {p["path"]: p for p in module.find_pythons(str(self.cache))}
        return dict(found[self.python])

    def runs(self) -> int:
        """How many times our python3 has run so far."""
        text = self.log.read_text() if self.log.exists() else ""
        return sum(1 for line in text.splitlines() if line == self.python)


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Host:
    return Host(tmp_path, monkeypatch)


def test_an_unchanged_interpreter_is_asked_once_then_remembered(host: Host) -> None:
    python = _elf_python()
    host.install(python)
    first = host.facts(kept=True)
    assert first["version"] == _version(python) and first["error"] is None
    assert host.runs() == 1
    assert host.facts(kept=True) == first  # the kept agent's memo
    assert host.facts(kept=False) == first  # a fresh agent: the private cache file
    assert host.runs() == 1
    cache = host.cache / "python-versions.marshal"
    assert cache.stat().st_mode & 0o777 == 0o600 and host.cache.stat().st_mode & 0o777 == 0o700


def test_a_replaced_interpreter_is_asked_again_and_its_new_version_reported(host: Host) -> None:
    python = _elf_python()
    other = _other_python(_version(python))
    host.install(python)
    assert host.facts(kept=True)["version"] == _version(python)
    assert host.runs() == 1
    if other is not None:  # the same path, another binary: the new version, from kept and fresh alike
        host.install(other)
        assert host.facts(kept=True)["version"] == _version(other)
        assert host.facts(kept=False)["version"] == _version(other)
        assert host.runs() == 2
    # Rewritten in place, its old mtime put back: the ctime moved, so it is run again.
    st = os.stat(host.python)
    data = Path(host.python).read_bytes()
    with open(host.python, "r+b") as handle:
        handle.write(data)
    os.utime(host.python, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = host.runs()
    host.facts(kept=True)
    assert host.runs() == before + 1


def test_a_script_interpreter_is_always_asked(host: Host) -> None:
    """A wrapper script (a pyenv shim) answers from files we cannot stat: never remembered."""
    python = _elf_python()
    Path(host.python).write_text(f"#!/bin/sh\nRUN_TAG=shim exec {python} \"$@\"\n")
    os.chmod(host.python, 0o755)
    for kept in (True, True, False):
        assert host.facts(kept=kept)["version"] == _version(python)
    assert host.log.read_text().splitlines().count("shim") == 3


def test_a_cache_file_not_private_to_this_user_is_not_trusted(host: Host) -> None:
    python = _elf_python()
    host.install(python)
    host.facts(kept=False)
    cache = host.cache / "python-versions.marshal"
    cache.chmod(0o644)  # readable by others: anyone might have written it
    assert host.facts(kept=False)["version"] == _version(python)
    assert host.runs() == 2
    cache.write_bytes(b"not marshal")
    cache.chmod(0o600)
    assert host.facts(kept=False)["version"] == _version(python)  # damaged: asked again, mended
    assert host.runs() == 3
    assert host.facts(kept=False)["version"] == _version(python)
    assert host.runs() == 3


def test_an_interpreter_changed_within_the_settle_time_is_always_asked(host: Host) -> None:
    """A file system's timestamps are coarse: a binary whose ctime is recent may change again within
    the same tick, so it is not remembered until it has settled."""
    host.install(_elf_python())
    host.settle_s = 3600.0  # every file here changed within the last hour
    for kept in (True, True, False):
        host.facts(kept=kept)
    assert host.runs() == 3
