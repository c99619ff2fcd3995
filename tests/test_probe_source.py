"""Source probes without a lab: the host-side module run on the REAL sglang sources, the core, the CLI.

The wheels of sglang 0.5.23 and 0.5.9 (PyPI, cached in .cache/wheels) are unpacked into two fake
site-packages; the remote module finds the package there through ``sys.path`` as it would in a
venv. The CLI tests use local hosts whose "venv" python is a wrapper pointing at those folders.
"""

from __future__ import annotations

import ast
import os
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli
from remote_support import remote_module
from sglang_support import NEW_SGLANG, OLD_SGLANG, wheel

from fleetctl.errors import InputError
from fleetctl.probes import Expect, check_expectation
from fleetctl.probes.search import GrepHostResult, GrepRequest, count_matrix, expectation
from fleetctl.probes.symbols import SymbolRequest
from fleetctl.transport.agent import module_source
from fleetctl.transport.base import HostResult, Status

source = remote_module("source")  # with its includes, as the agent ships it
SOURCE_FILE = Path(source.__file__)
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
HYBRID_LINEAR = "sglang/srt/layers/attention/hybrid_linear_attn_backend.py"
MAMBA_TERMS = ["update_mamba_state_after_mtp_verify", "disable_state_update", "mamba_intermediate", "Mamba"]
# Matching lines under sglang/srt, checked against the naive per-line oracle below.
MAMBA_COUNTS = {
    NEW_SGLANG: {"update_mamba_state_after_mtp_verify": 16, "disable_state_update": 10, "mamba_intermediate": 22,
                 "Mamba": 825},
    OLD_SGLANG: {"update_mamba_state_after_mtp_verify": 3, "disable_state_update": 19, "mamba_intermediate": 11,
                 "Mamba": 196},
}


@pytest.fixture(scope="session")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """version -> a site-packages folder holding that sglang wheel, unpacked."""
    out = {}
    for version in (NEW_SGLANG, OLD_SGLANG):
        site = tmp_path_factory.mktemp(f"site-{version}")
        with zipfile.ZipFile(wheel("sglang", version)) as zf:
            zf.extractall(site)
        out[version] = site
    return out


@contextmanager
def on_path(site: Path) -> Iterator[None]:
    sys.path.insert(0, str(site))
    try:
        yield
    finally:
        sys.path.remove(str(site))


def run(site: Path, **params: Any) -> dict[str, Any]:
    with on_path(site):
        answer: dict[str, Any] = source.main(params)
    return answer


def grep(site: Path, *terms: str, **params: Any) -> dict[str, Any]:
    return run(site, mode="grep", package=params.pop("package", "sglang"), terms=list(terms), **params)


def symbol(site: Path, name: str, **params: Any) -> dict[str, Any]:
    return run(site, mode="symbol", package=params.pop("package", "sglang"), name=name, **params)


def places(items: list[dict[str, Any]]) -> set[tuple[str, int]]:
    return {(i["path"], i["line"]) for i in items}


def naive_counts(folder: Path, terms: list[str], lower: bool = False) -> dict[str, int]:
    """The slow obvious way: every text file, every line."""
    counts = dict.fromkeys(terms, 0)
    for path in folder.rglob("*"):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        for raw in data.split(b"\n"):
            line = raw.lower() if lower else raw
            for term in terms:
                counts[term] += (term.lower() if lower else term).encode() in line
    return counts


# -- the module itself -------------------------------------------------------------------------

def test_remote_module_is_python38_syntax_and_stdlib_only() -> None:
    tree = ast.parse(module_source("source")[0], feature_version=(3, 8))  # with its includes
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names


def test_package_located_from_import_metadata(sites: dict[str, Path]) -> None:
    site = sites[NEW_SGLANG]
    answer = grep(site, "SpeculativeAlgorithm", subpath="srt/speculative")
    assert answer["package_dir"] == str(site / "sglang")
    assert answer["root"] == str(site)
    assert answer["python"] == sys.executable
    assert SPEC_INFO in [f["path"] for f in answer["files"]]


# -- symbol on the real sources ----------------------------------------------------------------

def test_speculative_algorithm_class_defined_in_spec_info(sites: dict[str, Path]) -> None:
    for site in sites.values():
        answer = symbol(site, "SpeculativeAlgorithm", subpath="srt")
        assert [(d["path"], d["kind"], d["scope"]) for d in answer["definitions"]] == [(SPEC_INFO, "class", "")]
        assert any(r["kind"] == "import" for r in answer["references"])
        assert answer["unparsable"] == []


def test_dflash_member_defined_in_new_release_only(sites: dict[str, Path]) -> None:
    new = symbol(sites[NEW_SGLANG], "SpeculativeAlgorithm.DFLASH")
    assert [(d["path"], d["line"], d["kind"], d["scope"], d["text"]) for d in new["definitions"]] == [
        (SPEC_INFO, 39, "enum member", "SpeculativeAlgorithm", "DFLASH = auto()")]
    refs = {(r["path"], r["line"]): r for r in new["references"]}
    assert refs[(SPEC_INFO, 118)]["scope"] == "SpeculativeAlgorithm.is_dflash"
    assert refs[(SPEC_INFO, 118)]["text"] == "return self == SpeculativeAlgorithm.DFLASH"
    assert ("sglang/srt/speculative/dflash_worker_v2.py", 2650) in refs
    assert all(r["kind"] == "attribute" for r in new["references"])
    # Only files holding both parts of the name are parsed, not the whole package.
    assert 0 < new["candidate_files"] < 50 < new["searched_files"]
    old = symbol(sites[OLD_SGLANG], "SpeculativeAlgorithm.DFLASH")
    assert old["definitions"] == old["references"] == []


def test_update_mamba_state_definitions_apart_from_call_sites(sites: dict[str, Path]) -> None:
    new = symbol(sites[NEW_SGLANG], "update_mamba_state_after_mtp_verify")
    defs = {(d["path"], d["scope"]): d for d in new["definitions"]}
    assert defs[(HYBRID_LINEAR, "HybridLinearAttnBackend")]["kind"] == "method"
    assert len({d["path"] for d in new["definitions"]}) >= 3  # other backends define it too
    assert {r["kind"] for r in new["references"]} == {"call"}
    assert "sglang/srt/speculative/spec_utils.py" in {r["path"] for r in new["references"]}
    assert not places(new["definitions"]) & places(new["references"])

    old = symbol(sites[OLD_SGLANG], "update_mamba_state_after_mtp_verify")
    assert places(old["definitions"]) == {(HYBRID_LINEAR, 1695)}
    assert places(old["references"]) == {("sglang/srt/speculative/eagle_worker.py", 855),
                                         ("sglang/srt/speculative/multi_layer_eagle_worker.py", 574)}
    assert old["references"][0]["scope"] == "EAGLEWorker._mamba_verify_update"


# -- grep on the real sources ------------------------------------------------------------------

@pytest.mark.parametrize("version", [NEW_SGLANG, OLD_SGLANG])
def test_grep_counts_match_a_naive_line_by_line_search(sites: dict[str, Path], version: str) -> None:
    site = sites[version]
    answer = grep(site, *MAMBA_TERMS, subpath="srt")
    assert answer["counts"] == MAMBA_COUNTS[version]
    assert answer["counts"] == naive_counts(site / "sglang" / "srt", MAMBA_TERMS)
    paths = [f["path"] for f in answer["files"]]
    assert paths == sorted(paths)
    assert sum(f["lines"] for f in answer["files"]) == answer["matched_lines"]


def test_forked_workers_answer_exactly_as_one_process(sites: dict[str, Path]) -> None:
    site = sites[NEW_SGLANG]

    def same(answer: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in answer.items() if k not in ("elapsed_ms", "workers")}

    for params in ({"context": 2, "max_hits": 37}, {"ignore_case": True, "max_hits": 0}):
        one = grep(site, *MAMBA_TERMS, subpath="srt", workers=1, **params)
        three = grep(site, *MAMBA_TERMS, subpath="srt", workers=3, **params)
        assert (one["workers"], three["workers"]) == (1, 3)
        assert same(one) == same(three)
    one = symbol(site, "update_mamba_state_after_mtp_verify", workers=1)
    assert same(one) == same(symbol(site, "update_mamba_state_after_mtp_verify", workers=4))


def _fail_on_one(part: list[int]) -> list[int]:
    if 1 in part:
        raise ValueError("slice with 1")
    return part


def _die_on_one(part: list[int]) -> list[int]:
    if 1 in part:
        os._exit(3)
    return part


def _no_children_left() -> bool:
    """No exited-but-unreaped child (a worker fan_out forgot). Children that other tests in this
    pytest process started and that still run do not count."""
    try:
        pid, _status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return pid == 0


def test_fan_out_reports_failed_workers_and_reaps_them() -> None:
    assert sorted(x for part in source.fan_out(lambda p: p, list(range(10)), 3) for x in part) == list(range(10))
    with pytest.raises(RuntimeError, match="a search worker failed: ValueError: slice with 1"):
        source.fan_out(_fail_on_one, list(range(10)), 3)
    with pytest.raises(RuntimeError, match="died without an answer"):
        source.fan_out(_die_on_one, list(range(10)), 3)
    with pytest.raises(ValueError, match="slice with 1"):  # the slice this process works on itself
        source.fan_out(_fail_on_one, list(range(10)), 1)
    assert _no_children_left()


def test_fan_out_hands_each_process_its_chunks_in_order() -> None:
    """Chunks are taken from a queue: every item once, and each process sees its items in increasing
    order (what grep's per-process budget of listed lines relies on), also for chunks of many items."""
    items = list(range(3 * source.MAX_CHUNKS + 7))
    parts = source.fan_out(lambda part: (os.getpid(), part), items, 3)
    assert sorted(x for _pid, part in parts for x in part) == items
    assert all(len(part) == 4 for _pid, part in parts[:-1] if part[-1] != items[-1])
    by_pid: dict[int, list[int]] = {}
    for pid, part in parts:
        by_pid.setdefault(pid, []).extend(part)
    assert os.getpid() not in by_pid  # the children do the work, this process hands out and collects
    assert all(seen == sorted(seen) for seen in by_pid.values())
    assert _no_children_left()


def test_fan_out_works_in_process_when_no_child_can_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fork() -> int:
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(source.os, "fork", no_fork)
    parts = source.fan_out(lambda part: part, list(range(600)), 3)
    assert [x for part in parts for x in part] == list(range(600))  # every chunk, in order


def test_grep_budget_across_chunks_and_workers(tmp_path: Path) -> None:
    """Many files with hits, more than one per chunk: the lines listed (max_hits) are the first ones
    by path whichever process searched which chunk."""
    for i in range(600):
        folder = tmp_path / "manypkg" / f"d{i % 7}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"m{i:03d}.py").write_text(f"x = 1\nneedle {i}\nneedle\n")
    with on_path(tmp_path):
        answers = [source.main({"mode": "grep", "package": "manypkg", "terms": ["needle"], "max_hits": 45,
                                "context": 1, "workers": w}) for w in (1, 2, 3)]
    assert [a["workers"] for a in answers] == [1, 2, 3]
    for answer in answers:
        answer.pop("elapsed_ms"), answer.pop("workers")
    assert answers[0] == answers[1] == answers[2]
    assert answers[0]["shown"] == 45 and answers[0]["matched_lines"] == 1200 and answers[0]["truncated"]
    listed = [(f["path"], h["line"]) for f in answers[0]["files"] for h in f["hits"]]
    assert listed == sorted(listed)[:45] and len({p for p, _ in listed}) == 23


def test_find_spec_is_importlib_util_find_spec(sites: dict[str, Path]) -> None:
    import importlib.util

    with on_path(sites[NEW_SGLANG]):
        for name in ("sglang", "os", "json", "sys", "no_such_package_here"):
            mine, theirs = source.find_spec(name), importlib.util.find_spec(name)
            assert (mine and (mine.name, mine.origin, mine.submodule_search_locations)) == (
                theirs and (theirs.name, theirs.origin, theirs.submodule_search_locations))


def test_grep_ignore_case_finds_lowercase(sites: dict[str, Path]) -> None:
    site = sites[NEW_SGLANG]
    exact = grep(site, "Mamba", subpath="srt/layers", max_hits=100000)
    folded = grep(site, "Mamba", subpath="srt/layers", ignore_case=True, max_hits=100000)
    assert folded["counts"]["Mamba"] > exact["counts"]["Mamba"]
    assert folded["counts"] == naive_counts(site / "sglang/srt/layers", ["Mamba"], lower=True)
    texts = [h["text"] for f in folded["files"] for h in f["hits"]]
    assert any("mamba" in t and "Mamba" not in t for t in texts)


def test_grep_regex_agrees_with_symbol_definitions(sites: dict[str, Path]) -> None:
    site = sites[NEW_SGLANG]
    answer = grep(site, r"^\s*def update_mamba_state_after_mtp_verify\(", regex=True)
    defs = symbol(site, "update_mamba_state_after_mtp_verify")["definitions"]
    hits = {(f["path"], h["line"]) for f in answer["files"] for h in f["hits"]}
    assert hits == places(defs)


def test_grep_context_lines(sites: dict[str, Path]) -> None:
    answer = grep(sites[NEW_SGLANG], "DFLASH = auto()", subpath="srt/speculative", context=2)
    (entry,) = answer["files"]
    assert entry["path"] == SPEC_INFO
    assert [(h["line"], h["text"]) for h in entry["hits"]] == [(39, "    DFLASH = auto()")]
    assert [n for n, _ in entry["context"]] == [37, 38, 40, 41]
    assert entry["context"][2] == [40, "    UNO = auto()"]


def test_max_hits_caps_the_listing_not_the_counts(sites: dict[str, Path]) -> None:
    site = sites[NEW_SGLANG]
    full = grep(site, *MAMBA_TERMS, subpath="srt", max_hits=100000)
    capped = grep(site, *MAMBA_TERMS, subpath="srt", max_hits=5)
    assert capped["counts"] == full["counts"] == MAMBA_COUNTS[NEW_SGLANG]
    assert capped["matched_lines"] == full["matched_lines"] == full["shown"]
    assert capped["shown"] == 5 and capped["truncated"] and not full["truncated"]
    listed = [(f["path"], h["line"]) for f in capped["files"] for h in f["hits"]]
    assert listed == [(f["path"], h["line"]) for f in full["files"] for h in f["hits"]][:5]
    assert [f["path"] for f in capped["files"]] == [f["path"] for f in full["files"]]  # every file still counted


def test_binary_files_skipped_in_the_real_wheel(sites: dict[str, Path]) -> None:
    answer = grep(sites[NEW_SGLANG], "PyInit", subpath="srt")  # in every extension module, never in source
    assert answer["binary_files"] == 5  # the .so files of 0.5.23's srt
    assert all(not f["path"].endswith(".so") for f in answer["files"])


# -- a small package with awkward files --------------------------------------------------------

FAKE_FILES = {
    "fakepkg/__init__.py": "from .mod import helper as Thing\nimport fakepkg.mod as target\n",
    "fakepkg/mod.py": (
        "from enum import Enum\n"
        "from other import target\n"
        "target = 1\n"
        "target: int\n"
        "class Algo(Enum):\n"
        "    target = 2\n"
        "    ALIASES = {target: 'x'}\n"
        "    def is_target(self):\n"
        "        return self == Algo.target or self.target\n"
        "def helper():\n"
        "    target = 3\n"
        "    return target + helper()\n"
        "async def target():\n"
        "    obj.target()\n"
        "# Ärger with ÄRGER\n"
    ),
    "fakepkg/broken.py": "def target(:\n",
    "fakepkg/data.txt": "target in a text file\n",
}


@pytest.fixture
def fake_site(tmp_path: Path) -> Path:
    for rel, text in FAKE_FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "fakepkg/blob.bin").write_bytes(b"\0\1target\n")
    (tmp_path / "fakepkg/__pycache__").mkdir()
    (tmp_path / "fakepkg/__pycache__/mod.cpython-311.pyc").write_bytes(b"target\n")
    return tmp_path


def test_binary_and_pycache_skipped_text_files_searched(fake_site: Path) -> None:
    answer = grep(fake_site, "target", package="fakepkg")
    paths = [f["path"] for f in answer["files"]]
    assert paths == ["fakepkg/__init__.py", "fakepkg/broken.py", "fakepkg/data.txt", "fakepkg/mod.py"]
    assert answer["binary_files"] == 1
    assert answer["searched_files"] == 4


def test_symbol_kinds_scopes_and_unparsable_file(fake_site: Path) -> None:
    answer = symbol(fake_site, "target", package="fakepkg")
    defs = [(d["path"], d["line"], d["kind"], d["scope"]) for d in answer["definitions"]]
    assert defs == [("fakepkg/mod.py", 3, "assignment", ""), ("fakepkg/mod.py", 4, "annotated assignment", ""),
                    ("fakepkg/mod.py", 6, "enum member", "Algo"), ("fakepkg/mod.py", 13, "async function", "")]
    refs = [(d["path"], d["line"], d["kind"], d["scope"]) for d in answer["references"]]
    assert refs == [
        ("fakepkg/__init__.py", 2, "import alias", ""),  # `import x as target` defines nothing
        ("fakepkg/mod.py", 2, "import", ""),
        ("fakepkg/mod.py", 7, "name", "Algo"),
        ("fakepkg/mod.py", 9, "attribute", "Algo.is_target"),
        ("fakepkg/mod.py", 9, "attribute", "Algo.is_target"),
        ("fakepkg/mod.py", 12, "name", "helper"),  # a local's use; the local assignment is no definition
        ("fakepkg/mod.py", 14, "call", "target"),
    ]
    assert answer["unparsable"] == [{"path": "fakepkg/broken.py", "error": answer["unparsable"][0]["error"]}]
    assert "SyntaxError" in answer["unparsable"][0]["error"] and "line 1" in answer["unparsable"][0]["error"]


def test_symbol_class_member(fake_site: Path) -> None:
    answer = symbol(fake_site, "Algo.target", package="fakepkg")
    assert places(answer["definitions"]) == {("fakepkg/mod.py", 6)}
    assert [(r["line"], r["text"]) for r in answer["references"]] == [
        (7, "ALIASES = {target: 'x'}"),  # the bare name, inside the class body only
        (9, "return self == Algo.target or self.target"),  # Algo.target
        (9, "return self == Algo.target or self.target"),  # self.target
    ]
    assert symbol(fake_site, "Thing", package="fakepkg")["definitions"] == []


def test_non_ascii_term_folds_case(fake_site: Path) -> None:
    answer = grep(fake_site, "ärger", package="fakepkg", ignore_case=True)
    assert answer["counts"] == {"ärger": 1}
    assert answer["files"][0]["hits"][0]["text"] == "# Ärger with ÄRGER"


@pytest.mark.parametrize(("params", "message"), [
    ({"mode": "grep", "package": "nosuchpkg", "terms": ["x"]},
     f"nosuchpkg is not installed for {sys.executable} (Python {sys.version.split()[0]})"),
    ({"mode": "grep", "package": "fakepkg", "terms": ["x"], "subpath": "nosuch"}, "subpath nosuch not found in"),
    ({"mode": "grep", "package": "fakepkg", "terms": ["x"], "subpath": "../.."}, "must stay inside"),
    ({"mode": "grep", "package": "fakepkg", "terms": ["a("], "regex": True}, "invalid regex 'a(': missing )"),
    ({"mode": "grep", "package": "fakepkg", "terms": [""]}, "empty search term"),
    ({"mode": "symbol", "package": "fakepkg", "name": "a.b-c"}, "bad symbol name"),
    ({"mode": "nope"}, "unknown mode"),
])
def test_bad_input_is_a_clear_error(fake_site: Path, params: dict[str, Any], message: str) -> None:
    with on_path(fake_site), pytest.raises(source.ProbeInputError) as info:
        source.main(params)
    assert message in str(info.value)


# -- the controller core -----------------------------------------------------------------------

def test_requests_refuse_bad_input_before_connecting() -> None:
    with pytest.raises(InputError, match="invalid regex"):
        GrepRequest(("a(",), regex=True).validate()
    with pytest.raises(InputError, match="inside the package"):
        GrepRequest(("a",), subpath="../x").validate()
    with pytest.raises(InputError, match="bad symbol name"):
        SymbolRequest("1abc").validate()
    assert GrepRequest(("a", "b", "a")).terms == ("a", "b")
    assert GrepRequest(("a",), subpath="srt").params()["subpath"] == "srt"


def _host(counts: dict[str, int]) -> GrepHostResult:
    return GrepHostResult([], counts, False, 10, "/site/sglang", "/venv/bin/python")


def test_count_matrix_and_expectations() -> None:
    results = {
        "lab1": HostResult("lab1", Status.OK, _host({"a": 2, "b": 1})),
        "lab2": HostResult("lab2", Status.OK, _host({"a": 3, "b": 0})),
        "lab3": HostResult("lab3", Status.OK, _host({"a": 0, "b": 0})),
        "lab4": HostResult[GrepHostResult]("lab4", Status.FAILED, reason="boom"),
    }
    rows = count_matrix(results, ("a", "b"))
    assert [(r.term, r.counts) for r in rows] == [
        ("a", {"lab1": 2, "lab2": 3, "lab3": 0, "lab4": None}), ("b", {"lab1": 1, "lab2": 0, "lab3": 0, "lab4": None})]
    assert rows[1].missing_on == ["lab2", "lab3"]
    present = check_expectation(results, expectation(Expect.PRESENT), Expect.PRESENT)
    assert present.failing == ("lab2", "lab3")  # any term with zero lines fails the host
    absent = check_expectation(results, expectation(Expect.ABSENT), Expect.ABSENT)
    assert absent.failing == ("lab1", "lab2")  # any term with a line fails the host


def test_host_result_round_trip(sites: dict[str, Path]) -> None:
    answer = grep(sites[NEW_SGLANG], "DFLASH", subpath="srt/speculative", context=1, max_hits=3)
    value = GrepHostResult.from_dict(answer)
    assert value.shown == 3 and value.not_shown == value.matched_lines - 3
    assert value.to_dict()["files"][0]["path"] == answer["files"][0]["path"]
    assert value.files[0].context


# -- the CLI on local hosts (no sshd) ----------------------------------------------------------

@pytest.fixture
def local_fleet(sites: dict[str, Path], tmp_path: Path) -> Path:
    """Two local hosts: `new` and `old`, each with a 'venv' whose python sees one unpacked wheel."""
    hosts = []
    for name, version in (("new", NEW_SGLANG), ("old", OLD_SGLANG)):
        python = tmp_path / name / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(f'#!/bin/sh\nPYTHONPATH={sites[version]} exec /usr/bin/python3 "$@"\n')
        python.chmod(0o755)
        hosts.append(f"    {name}:\n      ansible_connection: local\n      venv: {tmp_path / name}\n"
                     f"      fleetctl_state_dir: {tmp_path / name / 'state'}\n")  # its grep cache: not this machine's
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts:\n" + "".join(hosts))
    return inventory


def test_cli_grep_matrix_and_expect(local_fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(local_fleet), "probe", "grep", "DFLASH", "update_mamba_state_after_mtp_verify",
                "--subpath", "srt/speculative", "--max-hits", "2", "--expect", "present")
    assert r.rc == 1
    assert "expected every term present, but not on: old" in r.err
    assert "── new (1) ──" in r.out
    assert "more matching lines not shown (--max-hits 2)" in r.out
    matrix = r.out[r.out.index("matching lines per TERM"):]
    dflash_row = next(line for line in matrix.splitlines() if "DFLASH" in line)
    assert dflash_row.split("│")[3].strip() == "0"  # missing on old, visible in one look
    doc = run_cli(capsys, "-i", str(local_fleet), "probe", "grep", "DFLASH", "--subpath", "srt", "--json").json()
    assert doc["matrix"]["DFLASH"]["old"] == 0 < doc["matrix"]["DFLASH"]["new"]
    assert doc["hosts"]["new"]["value"]["counts"]["DFLASH"] == doc["matrix"]["DFLASH"]["new"]


def test_cli_symbol_and_bad_input(local_fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = str(local_fleet)
    r = run_cli(capsys, "-i", inv, "probe", "symbol", "SpeculativeAlgorithm.DFLASH", "--expect", "absent")
    assert r.rc == 1
    assert "not on: new" in r.err
    assert f"{SPEC_INFO}:39: DFLASH = auto()  (enum member in SpeculativeAlgorithm)" in r.out
    bad = run_cli(capsys, "-i", inv, "probe", "grep", "x(", "--regex")
    assert bad.rc == 3 and "invalid regex 'x('" in bad.err
    missing = run_cli(capsys, "-i", inv, "probe", "symbol", "x", "--package", "nosuchpkg", "--json")
    assert missing.rc == 2
    assert "nosuchpkg is not installed for" in missing.json()["hosts"]["old"]["reason"]


def test_search_workers_are_the_idle_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker per usable CPU less the 1-minute load (as make -l), at least one, at most
    MAX_WORKERS and one per FILES_PER_WORKER files; an explicit count wins."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    for load, files, want in ((0.3, 10_000, 8), (12.7, 10_000, 4), (40.0, 10_000, 1), (0.0, 700, 2), (0.0, 10, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert source.worker_count({}, files) == want, (load, files)
    assert source.worker_count({"workers": 3}, 10) == 3

    def unavailable() -> tuple[float, float, float]:
        raise OSError("no /proc/loadavg")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert source.worker_count({}, 10_000) == 8


def test_hosts_that_matched_alike_share_their_converted_lines() -> None:
    """The connection server gives hosts that matched alike one decoded list of files: each host's
    result and its --json entry then hold one converted list, not a copy per host (a thousand
    hosts' copies were most of a kept probe grep's memory); another list is converted on its own."""
    files = [{"path": "sglang/srt/a.py", "lines": 10, "counts": {"Mamba": 1},
              "hits": [{"line": 3, "text": "class Mamba:", "terms": ["Mamba"]}], "context": [[2, "x"]]}]
    base = {"counts": {"Mamba": 1}, "truncated": False, "searched_files": 5, "package_dir": "/p",
            "python": "/usr/bin/python3", "matched_lines": 1, "shown": 1}
    one, two = (GrepHostResult.from_dict({**base, "files": files, "elapsed_ms": ms}) for ms in (1.0, 2.0))
    assert one.files is two.files and one.to_dict()["files"] is two.to_dict()["files"]
    other = GrepHostResult.from_dict({**base, "files": [dict(files[0])]})
    assert other.files is not one.files and other.files == one.files
    assert one.to_dict()["files"] == files and one.to_dict()["elapsed_ms"] == 1.0
