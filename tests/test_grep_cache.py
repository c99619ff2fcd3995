"""The host's grep cache (fleetctl/remote/grep_cache.py), run as the agent ships source.py: a search
that repeats earlier terms reads no file that has not changed, and answers exactly as a search that
reads everything; a file that changed in any way is read again; a cache it cannot trust is ignored.

The real sglang 0.5.23 wheel's ``srt`` tree is the main subject (2,602 files, 141 holding a term).
Its files are fresh from the unpacking, so the tests that need them remembered set SETTLE_NS to 0
(a file is otherwise trusted by its stat only once it has been still for 2 s).
"""

from __future__ import annotations

import marshal
import os
import stat
import sys
import time
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli
from remote_support import remote_module
from sglang_support import NEW_SGLANG, wheel

TERMS = ["update_mamba_state_after_mtp_verify", "disable_state_update", "mamba_intermediate", "Mamba"]
NOT_CACHE = ("elapsed_ms", "cached_files", "cache")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site-grep-cache")
    with zipfile.ZipFile(wheel("sglang", NEW_SGLANG)) as zf:
        zf.extractall(folder, [n for n in zf.namelist() if n.startswith("sglang/")])
    return folder


@pytest.fixture
def source(site: Path) -> Iterator[Any]:
    """A fresh source.py module (its SETTLE_NS may be changed by a test), with ``site`` on sys.path."""
    sys.path.insert(0, str(site))
    try:
        yield remote_module("source")
    finally:
        sys.path.remove(str(site))


def grep(source: Any, cache_dir: Path | None, terms: list[str] = TERMS, **params: Any) -> dict[str, Any]:
    extra = {"cache_dir": str(cache_dir)} if cache_dir else {}
    answer: dict[str, Any] = source.main({"mode": "grep", "package": "sglang", "subpath": "srt", "terms": terms,
                                          "workers": 1, **extra, **params})
    return answer


def same(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k not in NOT_CACHE}


def count_reads(source: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths source.py reads from now on (in this process: workers=1)."""
    read: list[str] = []
    real = source.read_text_bytes

    def counted(path: str, stats: list[os.stat_result] | None = None) -> Any:
        read.append(path)
        return real(path, stats)

    monkeypatch.setitem(source.__dict__, "read_text_bytes", counted)
    return read


def cache_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("grep-*.marshal"))


def test_second_search_reads_no_file_and_answers_the_same(source: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    source.SETTLE_NS = 0
    plain = grep(source, None, context=1, max_hits=50)
    first = grep(source, tmp_path / "cache", context=1, max_hits=50)
    assert (first["cached_files"], first["cache"]) == (0, None)
    reads = count_reads(source, monkeypatch)
    second = grep(source, tmp_path / "cache", context=1, max_hits=50)
    assert same(plain) == same(first) == same(second)
    assert second["counts"] == {"update_mamba_state_after_mtp_verify": 16, "disable_state_update": 10,
                                "mamba_intermediate": 22, "Mamba": 825}
    assert reads == []  # the 141 files with a hit too: their entries were kept with them
    assert second["cached_files"] == second["searched_files"] + second["binary_files"] == 2602
    assert second["cache"] is None
    (cached,) = cache_files(tmp_path / "cache")
    assert stat.S_IMODE(cached.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700


def test_kept_listings_serve_fewer_hits_and_more_are_read_again(source: Any, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A file's kept entry lists what the first search's --max-hits left room for: a search that
    lists fewer lines cuts it as grep would; one that lists more reads the files it was cut in."""
    source.SETTLE_NS = 0
    plain = {n: grep(source, None, context=1, max_hits=n) for n in (10, 500)}
    grep(source, tmp_path, context=1, max_hits=50)
    reads = count_reads(source, monkeypatch)
    fewer = grep(source, tmp_path, context=1, max_hits=10)
    assert reads == [] and same(fewer) == same(plain[10])
    more = grep(source, tmp_path, context=1, max_hits=500)
    assert same(more) == same(plain[500])
    holding = {os.path.join(more["root"], f["path"]) for f in more["files"]}
    assert 0 < len(set(reads) & holding) == len(reads) < len(holding)  # only files with a hit, not all of them


def test_forked_workers_learn_and_use_the_cache(source: Any, tmp_path: Path) -> None:
    source.SETTLE_NS = 0
    first = grep(source, tmp_path, workers=3, max_hits=2000)
    second = grep(source, tmp_path, workers=3, max_hits=2000)
    assert (first["workers"], second["workers"]) == (3, 3)
    assert same(first) == same(second) == same(grep(source, None, workers=3, max_hits=2000))
    assert second["cached_files"] == second["searched_files"] + second["binary_files"]


def test_a_file_rewritten_with_its_size_and_mtime_kept_is_searched_again(
        source: Any, site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ctime is what catches it: a rewrite moves it, and no one can set it back."""
    source.SETTLE_NS = 0
    victim = site / "sglang" / "srt" / "utils" / "__init__.py"
    before = grep(source, tmp_path)
    assert not any(f["path"] == "sglang/srt/utils/__init__.py" for f in before["files"])
    original, st = victim.read_bytes(), victim.stat()
    try:
        time.sleep(0.01)
        victim.write_bytes(b"#Mamba" + original[6:])  # the same size
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same mtime
        assert victim.stat().st_size == st.st_size and victim.stat().st_mtime_ns == st.st_mtime_ns
        reads = count_reads(source, monkeypatch)
        after = grep(source, tmp_path)
        assert str(victim) in reads
        assert after["counts"]["Mamba"] == before["counts"]["Mamba"] + 1
        assert any(f["path"] == "sglang/srt/utils/__init__.py" for f in after["files"])
        assert same(after) == same(grep(source, None))
    finally:
        victim.write_bytes(original)


def test_a_file_changed_just_now_is_not_remembered(source: Any, site: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The racy-git rule: a file whose ctime is within SETTLE_NS of the search may change again
    within one clock tick without its stat moving, so it is read on every search until it is still."""
    fresh = site / "sglang" / "srt" / "fresh_notes.txt"
    fresh.write_text("nothing to see\n")
    try:
        source.SETTLE_NS = 0
        grep(source, tmp_path)  # everything else remembered
        fresh.write_text("nothing either\n")
        source.SETTLE_NS = 2 * 10 ** 9
        reads = count_reads(source, monkeypatch)
        grep(source, tmp_path)
        grep(source, tmp_path)
        assert reads.count(str(fresh)) == 2  # searched both times, never taken from the cache
        assert str(site / "sglang" / "srt" / "utils" / "__init__.py") not in reads
    finally:
        fresh.unlink()


def test_other_terms_or_flags_are_another_search(source: Any, tmp_path: Path) -> None:
    source.SETTLE_NS = 0
    grep(source, tmp_path)
    assert grep(source, tmp_path, terms=["Mamba"])["cached_files"] == 0
    assert grep(source, tmp_path, ignore_case=True)["cached_files"] == 0
    lowered = grep(source, tmp_path, ignore_case=True)
    assert lowered["cached_files"] > 0 and same(lowered) == same(grep(source, None, ignore_case=True))
    assert len(cache_files(tmp_path)) == 3


def rewritten(path: Path, **changes: Any) -> None:
    """The cache file with some of its fields changed, its checksum right."""
    data = path.read_bytes()
    doc = marshal.loads(data[data.index(b"\n") + 1:])
    body = marshal.dumps({**doc, **changes}, 2)
    path.write_bytes(b"%08x\n" % zlib.crc32(body) + body)


@pytest.mark.parametrize("spoil, why", [
    (lambda p: p.write_bytes(p.read_bytes()[:-40] + b"x" * 40), "damaged"),
    (lambda p: p.chmod(0o644), "not a private file of this user"),
    (lambda p: os.chown(p, 2400, 2400), "not a private file of this user"),
    (lambda p: rewritten(p, python="3.8.0 (another python)"), "not a grep cache of this search and python"),
    (lambda p: rewritten(p, key="('/elsewhere',)"), "not a grep cache of this search and python"),
])
def test_a_cache_file_it_cannot_trust_is_ignored_whole(source: Any, tmp_path: Path, spoil: Any, why: str) -> None:
    source.SETTLE_NS = 0
    grep(source, tmp_path)
    (cached,) = cache_files(tmp_path)
    spoil(cached)
    answer = grep(source, tmp_path)
    assert answer["cached_files"] == 0
    assert answer["cache"] == f"cache file ignored: {why}"
    assert same(answer) == same(grep(source, None))
    assert grep(source, tmp_path)["cached_files"] > 0  # the search that ignored it wrote a good one


def test_a_cache_folder_of_another_user_is_not_written(source: Any, tmp_path: Path) -> None:
    source.SETTLE_NS = 0
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 2400, 2400)
    answer = grep(source, theirs)
    assert answer["cache"] == f"cache not saved: {theirs} belongs to another user"
    assert same(answer) == same(grep(source, None)) and not cache_files(theirs)


def test_no_cache_dir_keeps_nothing(source: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    answer = grep(source, None)
    assert (answer["cached_files"], answer["cache"]) == (0, None)
    assert not list(tmp_path.rglob("grep-*"))


def test_only_the_last_used_caches_are_kept(source: Any, tmp_path: Path) -> None:
    for n in range(source.KEEP + 6):
        path = tmp_path / f"grep-{n:016x}.marshal"
        path.write_bytes(b"")
        os.utime(path, ns=(n * 10 ** 9, n * 10 ** 9))
    (tmp_path / "hashes-other.json").write_bytes(b"")  # drift's: not the grep cache's to remove
    source.forget_oldest(str(tmp_path))
    left = cache_files(tmp_path)
    assert len(left) == source.KEEP and left[0].name == f"grep-{6:016x}.marshal"
    assert (tmp_path / "hashes-other.json").exists()


def test_cli_no_cache_reads_everything_and_keeps_nothing(site: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """On a local host whose fleetctl_state_dir is a test folder: the default keeps the cache in
    STATE/cache (what the next search uses), --no-cache neither uses nor writes it."""
    time.sleep(max(0.0, 2.1 - (time.time() - (site / "sglang").stat().st_ctime)))  # the files settled
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec /usr/bin/python3 "$@"\n')
    python.chmod(0o755)
    state = tmp_path / "state"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(f"all:\n  hosts:\n    h1:\n      ansible_connection: local\n      venv: {tmp_path / 'venv'}\n"
                         f"      fleetctl_state_dir: {state}\n")
    argv = ["-i", str(inventory), "probe", "grep", "Mamba", "--subpath", "srt/layers", "--json"]
    fresh = run_cli(capsys, *argv, "--no-cache").json()["hosts"]["h1"]["value"]
    assert not (state / "cache").exists()
    assert fresh["cached_files"] == 0 and fresh["cache_note"] is None
    run_cli(capsys, *argv)
    assert len(cache_files(state / "cache")) == 1
    assert run_cli(capsys, *argv).json()["hosts"]["h1"]["value"]["cached_files"] > 0
    assert run_cli(capsys, *argv, "--no-cache").json()["hosts"]["h1"]["value"]["cached_files"] == 0
