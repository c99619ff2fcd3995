"""Drift audit: the host-side collector on real venvs built here, and the pure analysis."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from sglang_support import wheel_set

from fleetctl.drift import audit as core
from fleetctl.drift import report as drift_report
from fleetctl.drift.audit import Dist, HostInventory, Kind
from fleetctl.errors import InputError
from fleetctl.gpu.smi import GpuFacts
from fleetctl.lockfile import parse_lock
from fleetctl.transport.agent import module_source
from fleetctl.transport.base import HostResult, Status

SITE = "lib/python3.11/site-packages"


def collect_local(venv: Path, cache: Path, **params: object) -> dict:
    """Run the host-side collector exactly as the agent does: under the venv's own python."""
    code = ("import json,sys; ns = {'__name__': 'fleetctl_remote_distributions'}; exec(sys.argv[1], ns); "
            "print(json.dumps(ns['main'](json.loads(sys.argv[2]))))")
    args = json.dumps({"verify_files": True, "cache_dir": str(cache), **params})
    source = module_source("distributions")[0]  # with its includes, as the agent ships it
    out = subprocess.run([str(venv / "bin/python"), "-c", code, source, args],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def make_clean_venv(venv: Path) -> Path:
    """requests and its dependencies installed by real pip from real wheels: pip check is clean."""
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--disable-pip-version-check", *map(str, wheel_set("requests==2.32.3"))], check=True)
    return venv


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_clean_venv(tmp_path_factory.mktemp("drift") / "venv")


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A fresh venv per test (a copied venv would carry the original's shebangs: a finding itself)."""
    return make_clean_venv(tmp_path / "venv")


def inventory(raw: dict, host: str = "h1") -> HostInventory:
    return core.parse_inventory(host, "/v", raw, GpuFacts())


def test_clean_pip_install_reports_nothing(clean_venv: Path, tmp_path: Path) -> None:
    raw = collect_local(clean_venv, tmp_path / "cache")
    names = {d["name"] for d in raw["dists"]}
    assert {"requests", "urllib3", "idna", "certifi", "charset-normalizer", "pip"} <= names
    files = raw["files"]
    assert files["checked"] > 100
    assert [files[k] for k in ("modified", "missing", "orphans", "foreign_shebangs")] == [[], [], [], []]
    inv = inventory(raw)
    assert core.unsatisfied_findings(inv) == []
    assert core.file_findings(inv) == []
    assert core.duplicate_findings(inv) == []


def test_second_run_hits_the_hash_cache(clean_venv: Path, tmp_path: Path) -> None:
    first = collect_local(clean_venv, tmp_path / "cache")["files"]
    second = collect_local(clean_venv, tmp_path / "cache")["files"]
    assert first["cache_misses"] == first["checked"] > 0
    assert second["cache_hits"] == second["checked"] and second["cache_misses"] == 0


def test_hand_edit_missing_file_orphan_and_cache_invalidation(venv: Path, tmp_path: Path) -> None:
    collect_local(venv, tmp_path / "cache")  # warm the cache, then change files under it
    site = venv / SITE
    with open(site / "requests/api.py", "a") as handle:
        handle.write("# hand edit\n")
    (site / "idna/codec.py").unlink()
    (site / "urllib3/stray_leftover.py").write_text("x = 1\n")
    (site / "urllib3/__pycache__").mkdir(exist_ok=True)
    (site / "urllib3/__pycache__/stray.cpython-311.pyc").write_bytes(b"\0")  # caches are ignored
    files = collect_local(venv, tmp_path / "cache")["files"]
    assert files["modified"] == [{"dist": "requests", "path": f"{SITE}/requests/api.py"}]
    assert files["missing"] == [{"dist": "idna", "path": f"{SITE}/idna/codec.py"}]
    assert files["orphans"] == [{"dist": "urllib3", "path": f"{SITE}/urllib3/stray_leftover.py"}]


def test_copied_over_version_gives_duplicate_dist_info_and_orphans(venv: Path, tmp_path: Path) -> None:
    site = venv / SITE
    old = tmp_path / "old"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(old),
                    str(_old_idna())], check=True)
    shutil.copytree(old, site, dirs_exist_ok=True)  # the hand-made overlay of today
    raw = collect_local(venv, tmp_path / "cache")
    inv = inventory(raw)
    dup = core.duplicate_findings(inv)
    assert [f.package for f in dup] == ["idna"] and "2 dist-info folders" in dup[0].detail
    kinds = {f.kind for f in core.file_findings(inv)}
    assert Kind.MODIFIED in kinds  # files of the newer RECORD now hold the older content


def _old_idna() -> Path:
    from sglang_support import wheel

    return wheel("idna", "3.7")


def test_console_script_shebang_rewritten_is_clean_but_foreign_shebang_is_flagged(venv: Path, tmp_path: Path) -> None:
    script = venv / "bin/normalizer"
    assert script.read_text().startswith(f"#!{venv}/bin/python")  # pip rewrote it for this venv
    assert collect_local(venv, tmp_path / "c")["files"]["modified"] == []
    text = script.read_text().split("\n", 1)[1]
    script.write_text("#!/opt/other-host/ml-env/bin/python3.12\n" + text)  # copied from another host
    files = collect_local(venv, tmp_path / "c")["files"]
    assert files["foreign_shebangs"] == [{"dist": "charset-normalizer", "path": "bin/normalizer",
                                          "interpreter": "/opt/other-host/ml-env/bin/python3.12"}]
    assert files["modified"] == []  # the same script modulo its shebang line


def test_release_patched_file_is_reported_as_patched(venv: Path, tmp_path: Path) -> None:
    import hashlib

    target = venv / SITE / "requests/sessions.py"
    target.write_text(target.read_text() + "# DDTree patch\n")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"release_id": "ddtree-1", "venv_files": {
        f"{SITE}/requests/sessions.py": hashlib.sha256(target.read_bytes()).hexdigest()}}))
    files = collect_local(venv, tmp_path / "c", release_manifest=str(manifest))["files"]
    assert files["modified"] == []
    assert [(p["path"], p["release"]) for p in files["patched"]] == [(f"{SITE}/requests/sessions.py", "ddtree-1")]


def _cache_file(cache: Path) -> Path:
    (found,) = cache.glob("hashes-*.json")
    return found


def test_hash_cache_is_private_and_not_rewritten_when_nothing_changed(clean_venv: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    collect_local(clean_venv, cache)
    path, (parsed,) = _cache_file(cache), cache.glob("dists-*.marshal")
    assert cache.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o777 == 0o600 and parsed.stat().st_mode & 0o777 == 0o600
    before = [path.stat(), parsed.stat()]
    answer = collect_local(clean_venv, cache)
    files = answer["files"]
    assert files["cache_misses"] == 0 and files["cache_error"] is None and files["cache_ignored"] is None
    assert answer["dist_cache"] == {"ignored": None, "error": None}
    after = [path.stat(), parsed.stat()]
    assert [(a.st_ino, a.st_mtime_ns) for a in after] == [(b.st_ino, b.st_mtime_ns) for b in before]  # not rewritten
    assert sorted(cache.iterdir()) == sorted([path, parsed])  # no temp file left behind


def test_rewrite_that_restores_the_old_mtime_is_still_found(venv: Path, tmp_path: Path) -> None:
    import os

    cache = tmp_path / "cache"
    collect_local(venv, cache)
    target = venv / SITE / "requests/api.py"
    st = target.stat()
    data = target.read_bytes()
    with open(target, "r+b") as handle:  # same inode, same size, other bytes
        handle.write(b"#" if data[:1] != b"#" else b"_")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # the old mtime put back: only ctime tells
    assert (target.stat().st_size, target.stat().st_mtime_ns, target.stat().st_ino) == (
        st.st_size, st.st_mtime_ns, st.st_ino)
    files = collect_local(venv, cache)["files"]
    assert files["modified"] == [{"dist": "requests", "path": f"{SITE}/requests/api.py"}]
    assert files["cache_misses"] == 1


def test_orphan_added_and_removed_under_a_warm_cache(venv: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    collect_local(venv, cache)
    stray = venv / SITE / "idna/deep"
    stray.mkdir()
    (stray / "left.py").write_text("x = 1\n")
    assert collect_local(venv, cache)["files"]["orphans"] == [{"dist": "idna", "path": f"{SITE}/idna/deep/left.py"}]
    (stray / "left.py").unlink()
    files = collect_local(venv, cache)["files"]
    assert files["orphans"] == [] and files["cache_misses"] == 0


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong types", "other venv", "readable by others"])
def test_corrupt_or_foreign_hash_cache_is_ignored(clean_venv: Path, tmp_path: Path, damage: str) -> None:
    import hashlib

    cache = tmp_path / "cache"
    first = collect_local(clean_venv, cache)["files"]
    path = _cache_file(cache)
    text = path.read_text()
    _check, head, body = text.split("\n", 2)  # sha256 of the head; the head (snapshots); the entries

    def write(doc: dict, body: str) -> None:  # intact checksums: only the checks on the contents can refuse it
        doc["body_sha256"] = hashlib.sha256(body.encode()).hexdigest()
        head = json.dumps(doc)
        path.write_text(hashlib.sha256(head.encode()).hexdigest() + "\n" + head + "\n" + body)

    if damage == "garbage":
        path.write_bytes(b"\x00\xff not json")
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "wrong types":
        doc = json.loads(head)
        for snap in doc["snapshots"].values():
            snap["pin"] = "x"  # no snapshot holds: the per-file entries are read, and are not what is written
        entries = json.loads(body)
        entries["files"] = {k: [v[0], v[1], v[2], v[3], 12345] for k, v in entries["files"].items()}
        write(doc, json.dumps(entries))
    elif damage == "other venv":
        doc = json.loads(head)
        doc["key"] = "/somewhere/else"
        write(doc, body)
    else:
        path.chmod(0o644)
    files = collect_local(clean_venv, cache)["files"]
    assert files["cache_ignored"]
    assert files["cache_hits"] == 0 and files["cache_misses"] == first["cache_misses"]  # all hashed again
    assert [files[k] for k in ("modified", "missing", "orphans", "foreign_shebangs")] == [[], [], [], []]
    assert path.stat().st_mode & 0o777 == 0o600
    again = collect_local(clean_venv, cache)["files"]  # the rewritten cache is good again
    assert again["cache_ignored"] is None and again["cache_misses"] == 0


def test_record_rows_are_what_csv_reads() -> None:
    """RECORD parsing splits unquoted lines itself: the rows stay those csv.reader gives."""
    import csv

    from fleetctl.remote import distributions  # type: ignore[attr-defined]

    texts = ["a.py,sha256=x,12\nb/c.py,,\n", '"w=16,H=7168.json",sha256=y,3\nplain,sha256=z,4\n',
             'x"y,z,1\n"a""b",c,2\n"a"b,c,3\n', '"a,\nb",sha256=q,5\nnext,sha256=r,6\n', "\n,\n,,\nonly\n",
             "crlf.py,sha256=s,7\r\nlast,sha256=t,8"]
    for text in texts:
        want = [(r[0], r[1] if len(r) > 1 else "", int(r[2]) if len(r) > 2 and r[2].isdigit() else None)
                for r in csv.reader(text.splitlines()) if r and r[0]]
        assert distributions.parse_record(text) == want, text


# --- pure analysis ---------------------------------------------------------------------------

def _inv(host: str, versions: dict[str, str], requires: dict[str, tuple[str, ...]] | None = None,
         stack: dict[str, str | None] | None = None) -> HostInventory:
    dists = {n: [Dist(n, v, f"{n}-{v}.dist-info", "pip", None, (requires or {}).get(n, ()))]
             for n, v in versions.items()}
    markers = {"python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64",
               "python_full_version": "3.11.2", "implementation_name": "cpython", "os_name": "posix"}
    return HostInventory(host, "/v", "/v/bin/python", stack or {"python": "3.11.2"}, markers, dists)


def _results(*invs: HostInventory) -> dict[str, HostResult[HostInventory]]:
    return {i.host: HostResult(i.host, Status.OK, i) for i in invs}


def test_majority_baseline_version_missing_extra() -> None:
    r = _results(_inv("a", {"sglang": "0.5.23", "torch": "2.9.1"}), _inv("b", {"sglang": "0.5.23", "torch": "2.9.1"}),
                 _inv("c", {"sglang": "0.5.9", "flashinfer": "0.6"}))
    report = core.audit(r)
    assert report.baseline.versions == {"sglang": "0.5.23", "torch": "2.9.1"}
    got = {(f.host, f.kind, f.package) for fs in report.findings.values() for f in fs}
    assert got == {("c", Kind.VERSION, "sglang"), ("c", Kind.MISSING, "torch"), ("c", Kind.EXTRA, "flashinfer")}
    assert report.drifting_hosts == ["c"]
    assert report.summary() == "1 of 3 hosts drift: 3 packages differ"


def test_host_baseline_and_packages_filter() -> None:
    r = _results(_inv("a", {"sglang": "0.5.9", "torch": "2.8"}), _inv("b", {"sglang": "0.5.23", "torch": "2.9"}))
    report = core.audit(r, baseline_host="a", packages=["sgl*"])
    got = [(f.host, f.package, f.expected, f.actual) for f in report.findings["b"]]
    assert got == [("b", "sglang", "0.5.9", "0.5.23")]
    assert report.findings["a"] == []
    with pytest.raises(InputError, match="--baseline zz: that host is not among"):
        core.audit(r, baseline_host="zz")


def test_unsatisfied_requirements_like_pip_check() -> None:
    inv = _inv("a", {"sglang": "0.5.23", "torch": "2.8.0", "numpy": "2.1"}, requires={"sglang": (
        "torch==2.9.1", "numpy>=2", "flashinfer-python==0.7.2", "pywin32; sys_platform == 'win32'",
        "pytest; extra == 'test'")})
    found = {(f.expected, f.actual) for f in core.unsatisfied_findings(inv)}
    assert found == {("torch==2.9.1", "2.8.0"), ("flashinfer-python==0.7.2", None)}


def test_a_skipped_kind_is_not_looked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--skip unsatisfied: the same report less those findings, and pip check's evaluation never run
    (nothing kept in its cache): most of drift's controller CPU per host (issue 37)."""
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path))
    r = _results(_inv("a", {"sglang": "0.5.23", "torch": "2.8.0"}, requires={"sglang": ("torch==2.9.1",)}),
                 _inv("b", {"sglang": "0.5.9", "torch": "2.8.0"}, requires={"sglang": ("torch==2.9.1",)}))
    skipped = core.audit(r, baseline_host="a", skip=["unsatisfied"])
    assert not (tmp_path / "drift-requirements").exists()
    full = core.audit(r, baseline_host="a")
    assert (tmp_path / "drift-requirements").is_dir()
    assert {h: [f for f in fs if f.kind is not Kind.UNSATISFIED] for h, fs in full.findings.items()} == skipped.findings
    assert [f.kind for f in full.findings["b"]] == [Kind.VERSION, Kind.UNSATISFIED]


def test_drift_reads_hosts_models_without_the_release_spec() -> None:
    """What drift imports to read each host's serving models leaves pydantic and the release spec's
    models unbuilt (a tenth of a second of every drift run; issue 37)."""
    modules = "fleetctl.cli.drift, fleetctl.drift.audit, fleetctl.drift.report, fleetctl.models.status"
    code = (f"import sys; import {modules}; "
            "print(sorted(m for m in ('pydantic', 'fleetctl.models.spec') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_lock_baseline_and_errors(tmp_path: Path) -> None:
    lock = tmp_path / "req.lock"
    lock.write_text("# pip freeze\nsglang==0.5.23\nTorch==2.9.1  # pinned\n")
    pins = parse_lock(lock)
    host = _inv("a", {"sglang": "0.5.9", "torch": "2.9.1", "pip": "23"})
    report = core.audit(_results(host), lock=(pins, "req.lock"))
    assert [(f.kind, f.package) for f in report.findings["a"]] == [(Kind.VERSION, "sglang")]  # pip is never pinned
    for text, error in (("sglang>=0.5\n", ":1: 'sglang>=0.5' is not an exact pin"),
                        ("a==1\n\na==2\n", ":3: a is pinned twice (first on line 1)"),
                        ("-e .\n", ":1: options like '-e' are not supported"),
                        ("not a req!!\n", ":1: not a requirement")):
        lock.write_text(text)
        with pytest.raises(InputError, match=f"^{lock}{error}".replace("(", r"\(").replace(")", r"\)")):
            parse_lock(lock)


def test_failed_hosts_are_kept_apart() -> None:
    r = _results(_inv("a", {"x": "1"}))
    r["b"] = HostResult("b", Status.UNREACHABLE, reason="cannot connect")
    report = core.audit(r)
    assert "1 hosts failed (b)" in report.summary()
    assert drift_report.to_json(report)["hosts"]["b"] == {"status": "unreachable", "reason": "cannot connect"}
    for i in range(12):  # a thousand failed hosts make no summary line: the first ten, then how many more
        r[f"h{i:02d}"] = HostResult(f"h{i:02d}", Status.FAILED, reason="no venv")
    line = core.audit(r).summary()
    assert line.endswith("; 13 hosts failed (b, h00, h01, h02, h03, h04, h05, h06, h07, h08 (+3 more))"), line


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: list[tuple[str, str]] = []
        self.scripts = 0
        self._cls: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.scripts += tag == "script"
        self._cls = dict(attrs).get("class") or "" if tag == "td" else None

    def handle_data(self, data: str) -> None:
        if self._cls is not None:
            self.cells.append((self._cls, data))
            self._cls = None


def test_html_and_markdown_renderings() -> None:
    evil = "<script>alert(1)</script>"
    r = _results(_inv("a", {"sglang": "0.5.23"}), _inv("b", {"sglang": "0.5.23"}), _inv("c", {"sglang": evil}))
    report = core.audit(r)
    html = drift_report.to_html(report)
    parser = _Cells()
    parser.feed(html)
    assert parser.scripts == 0  # host data is escaped, and the file needs no scripts
    assert "http://" not in html.split("</style>")[0] and "<link" not in html  # self-contained
    assert ("baseline", "0.5.23") in parser.cells and ("version", evil) in parser.cells
    md = drift_report.to_markdown(report).splitlines()
    assert md[0] == "## Drift audit: 1 of 3 hosts drift: 1 packages differ"
    header = next(line for line in md if line.startswith("| package"))
    assert header == "| package | baseline | a | b | c |"
    row = next(line for line in md if line.startswith("| sglang"))
    assert row.count("|") == 6 and "(version)" in row


def test_a_kept_agent_rereads_a_record_that_changed(tmp_path: Path) -> None:
    """The kept agent's memo answers an unchanged RECORD from memory, never a changed one."""
    source = module_source("distributions")[0]
    memo: dict[object, object] = {}

    def read(path: Path) -> tuple[tuple[tuple[str, str, int | None], ...], str]:
        ns: dict[str, object] = {"__name__": "fleetctl_remote_distributions", "AGENT_MEMO": memo}
        exec(compile(source, "distributions.py", "exec"), ns)  # a fresh namespace, as each command gets
        return ns["read_record"](str(path))  # type: ignore[operator,no-any-return]

    record = tmp_path / "RECORD"
    record.write_text("pkg/__init__.py,sha256=abc,3\n")
    first = read(record)
    assert [row[0] for row in first[0]] == ["pkg/__init__.py"]
    assert read(record) is first  # unchanged: from memory
    record.write_text("pkg/__init__.py,sha256=abde,4\n")  # rewritten in place (same inode)
    changed = read(record)
    assert changed[0][0][1] == "sha256=abde" and changed[1] != first[1]
    no_memo: dict[str, object] = {"__name__": "child"}  # a one-off child process: no memo at all
    exec(compile(source, "distributions.py", "exec"), no_memo)
    assert no_memo["read_record"](str(record))[0] == changed[0]  # type: ignore[operator]


def _shared_wheel(folder: Path, name: str, body: str) -> Path:
    """A tiny real wheel installing its own package and a top-level build_backend.py."""
    import base64
    import hashlib
    import zipfile
    info = f"{name}-1.0.dist-info"
    files = {f"{name}/__init__.py": "", "build_backend.py": body,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rows = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
            f"{len(t.encode())}" for p, t in files.items()]
    whl = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
        z.writestr(f"{info}/RECORD", "\n".join([*rows, f"{info}/RECORD,,"]) + "\n")
    return whl


def test_a_file_two_distributions_install_is_shared_not_modified(tmp_path: Path) -> None:
    """flashinfer-python and torch_c_dlpack_ext both install build_backend.py; the later one wins."""
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    first = _shared_wheel(tmp_path, "flashinfer_python", "FLASHINFER = 1\n")
    second = _shared_wheel(tmp_path, "torch_c_dlpack_ext", "DLPACK = 1\n")
    for whl in (first, second):  # in this order, as pip installs the closure
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                        "--disable-pip-version-check", "--prefix", str(venv), "--no-warn-script-location",
                        str(whl)], check=True, capture_output=True)
    files = collect_local(venv, tmp_path / "cache")["files"]
    assert files["modified"] == []
    assert files["shared"] == [{"dist": "torch-c-dlpack-ext", "path": f"{SITE}/build_backend.py",
                                "owners": ["flashinfer-python", "torch-c-dlpack-ext"],
                                "installed": "torch-c-dlpack-ext"}]
    (finding,) = core.file_findings(inventory(collect_local(venv, tmp_path / "cache")))  # warm: the same answer
    assert finding.kind is Kind.SHARED and finding.kind in core.INFO_KINDS
    assert finding.detail == (f"{SITE}/build_backend.py shared by flashinfer-python and torch-c-dlpack-ext; "
                              "torch-c-dlpack-ext's copy is installed")
    (venv / SITE / "build_backend.py").write_text("HAND = 1\n")  # matches neither owner: a hand edit
    files = collect_local(venv, tmp_path / "cache")["files"]
    assert files["shared"] == [] and {i["path"] for i in files["modified"]} == {f"{SITE}/build_backend.py"}
    assert len(files["modified"]) == 2  # both owners' RECORDs disagree with it
