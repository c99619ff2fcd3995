"""The caches that make a warm ``drift`` cheap never hide a change: the host's parsed dist-info
cache (METADATA, RECORD) and the controller's kept ``pip check`` answers."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from test_drift import SITE, collect_local, make_clean_venv

from fleetctl.drift import audit as core
from fleetctl.drift import requirements as drift_requirements
from fleetctl.drift.audit import Dist, HostInventory, Kind
from fleetctl.gpu.smi import GpuFacts


def _dist_info(venv: Path, name: str) -> Path:
    (found,) = (venv / SITE).glob(f"{name}-*.dist-info")
    return found


def test_a_warm_dist_cache_still_sees_changed_metadata_record_and_files(tmp_path: Path) -> None:
    venv, cache = make_clean_venv(tmp_path / "venv"), tmp_path / "cache"
    first = collect_local(venv, cache)
    warm = collect_local(venv, cache)
    assert warm["dist_cache"] == {"ignored": None, "error": None}
    assert warm["dists"] == first["dists"]  # the same answer from the cache as from parsing
    info = _dist_info(venv, "idna")
    text = (info / "METADATA").read_text()
    head, sep, body = text.partition("\n\n")
    (info / "METADATA").write_text(head + "\nRequires-Dist: not-installed-here>=1" + sep + body)  # in place
    (venv / SITE / "requests/api.py").write_text("# replaced by hand\n")
    record = _dist_info(venv, "certifi") / "RECORD"
    rows = record.read_text().splitlines()
    record.write_text("\n".join(r for r in rows if not r.startswith("certifi/core.py,")) + "\n")
    raw = collect_local(venv, cache)
    idna = next(d for d in raw["dists"] if d["name"] == "idna")
    assert "not-installed-here>=1" in idna["requires"]
    files = raw["files"]
    assert files["modified"] == [{"dist": "idna", "path": f"{SITE}/{info.name}/METADATA"},  # RECORD hashes it
                                 {"dist": "requests", "path": f"{SITE}/requests/api.py"}]
    assert {"dist": "certifi", "path": f"{SITE}/certifi/core.py"} in files["orphans"]  # no RECORD lists it now
    certifi = next(d for d in raw["dists"] if d["name"] == "certifi")
    assert certifi["record_files"] == len(rows) - 1
    inv = core.parse_inventory("h1", str(venv), raw, GpuFacts())
    assert [(f.package, f.expected) for f in core.unsatisfied_findings(inv)] == [("idna", "not-installed-here>=1")]


@pytest.mark.parametrize("damage", ["garbage", "checksum intact, other python", "readable by others"])
def test_a_damaged_or_foreign_dist_cache_is_ignored(tmp_path: Path, damage: str) -> None:
    import marshal

    venv, cache = make_clean_venv(tmp_path / "venv"), tmp_path / "cache"
    first = collect_local(venv, cache)
    (path,) = cache.glob("dists-*.marshal")
    if damage == "garbage":
        path.write_bytes(path.read_bytes()[:-100] + b"\x00" * 100)
    elif damage == "readable by others":
        path.chmod(0o644)
    else:
        doc = marshal.loads(path.read_bytes().partition(b"\n")[2])
        doc["python"] = "2.7.18"
        body = marshal.dumps(doc, 2)
        path.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    again = collect_local(venv, cache)
    assert again["dist_cache"]["ignored"]
    assert again["dists"] == first["dists"] and again["files"]["modified"] == []
    assert collect_local(venv, cache)["dist_cache"] == {"ignored": None, "error": None}  # written anew
    assert path.stat().st_mode & 0o777 == 0o600


def _inv(requires: tuple[str, ...], numpy: str = "2.1") -> HostInventory:
    dists = {"sglang": [Dist("sglang", "0.5.23", "sglang-0.5.23.dist-info", "pip", None, requires)],
             "numpy": [Dist("numpy", numpy, f"numpy-{numpy}.dist-info", "pip", None, ())]}
    markers = {"python_version": "3.11", "sys_platform": "linux", "python_full_version": "3.11.2"}
    return HostInventory("a", "/v", "/v/bin/python", {}, markers, dists)


def test_kept_requirement_answers_follow_a_changed_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path))
    inv = _inv(("numpy>=2", "torch==2.9.1"))
    first = core.unsatisfied_findings(inv)
    assert [(f.kind, f.expected, f.actual) for f in first] == [(Kind.UNSATISFIED, "torch==2.9.1", None)]
    assert len(list((tmp_path / "drift-requirements").glob("*.json"))) == 1
    evaluated = []
    real = drift_requirements.evaluate
    monkeypatch.setattr(drift_requirements, "evaluate", lambda *a: evaluated.append(a) or real(*a))
    assert core.unsatisfied_findings(inv) == first and evaluated == []  # the kept answer
    changed = core.unsatisfied_findings(_inv(("numpy>=3",)))  # another Requires-Dist: evaluated again
    assert [(f.expected, f.actual) for f in changed] == [("numpy>=3", "2.1")] and len(evaluated) == 1
    older = core.unsatisfied_findings(_inv(("numpy>=2", "torch==2.9.1"), numpy="1.26"))  # another version
    assert [(f.expected, f.actual) for f in older] == [("numpy>=2", "1.26"), ("torch==2.9.1", None)]
    assert len(evaluated) == 2
    for path in (tmp_path / "drift-requirements").glob("*.json"):
        path.write_text('{"not": "a list"}')  # damaged: evaluated again, never believed
    assert core.unsatisfied_findings(inv) == first and len(evaluated) == 3


def _collect_forked(venv: Path, cache: Path) -> dict:
    """collect_local with the stat pass spread over 3 forked workers whatever the venv's size."""
    import json
    import subprocess

    from fleetctl.transport.agent import module_source
    code = ("import json,sys; ns = {'__name__': 'fleetctl_remote_distributions'}; exec(sys.argv[1], ns); "
            "ns['PARALLEL_MIN_FILES'] = 0; ns['worker_count'] = lambda: 3; "
            "print(json.dumps(ns['main'](json.loads(sys.argv[2]))))")
    args = json.dumps({"verify_files": True, "cache_dir": str(cache)})
    out = subprocess.run([str(venv / "bin/python"), "-c", code, module_source("distributions")[0], args],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_forked_stat_pass_answers_as_one_process(tmp_path: Path) -> None:
    venv = make_clean_venv(tmp_path / "venv")
    one = collect_local(venv, tmp_path / "one")
    forked = _collect_forked(venv, tmp_path / "forked")
    assert forked["dists"] == one["dists"] and forked["files"]["checked"] == one["files"]["checked"]
    again = _collect_forked(venv, tmp_path / "forked")["files"]  # warm: every outcome from its snapshot
    assert again["cache_misses"] == 0 and again["cache_hits"] == again["checked"]
    (venv / SITE / "urllib3/util/retry.py").write_text("# hand edit\n")
    (venv / SITE / "idna/codec.py").unlink()
    files = _collect_forked(venv, tmp_path / "forked")["files"]
    assert files["modified"] == [{"dist": "urllib3", "path": f"{SITE}/urllib3/util/retry.py"}]
    assert files["missing"] == [{"dist": "idna", "path": f"{SITE}/idna/codec.py"}]


_KEPT_AGENT = """
import json, os, sys
ns = {'__name__': 'fleetctl_remote_distributions', 'AGENT_MEMO': {}}  # one kept agent's memory
exec(sys.argv[1], ns)
params, path = json.loads(sys.argv[2]), sys.argv[3]
reads = []
real = ns['read_private']
ns['read_private'] = lambda p: reads.append(p) or real(p)
def run():
    before = len(reads)
    answer = ns['main'](params)
    return {'read': len(reads) - before, 'ignored': answer['dist_cache']['ignored'],
            'versions': {d['name']: d['version'] for d in answer['dists']}}
out = [run(), run()]
meta = sys.argv[4]
with open(meta) as f:
    text = f.read()
with open(meta, 'w') as f:
    f.write(text.replace('\\nVersion: ', '\\nVersion: 9', 1))  # in place: the dist is parsed again, the file saved
out += [run(), run()]
os.chmod(path, 0o644)  # no longer private: not believed, whatever this agent remembers
out.append(run())
print(json.dumps(out))
"""


def test_a_kept_agent_remembers_the_dist_cache_only_while_the_file_is_the_same(tmp_path: Path) -> None:
    """A kept agent decodes the dist cache once, not on every command (that decode was most of a
    version-only audit on the host); a rewritten or no longer private file is read again."""
    import json
    import subprocess

    from fleetctl.transport.agent import module_source

    venv, cache = make_clean_venv(tmp_path / "venv"), tmp_path / "cache"
    collect_local(venv, cache)  # the cache file exists
    (path,) = cache.glob("dists-*.marshal")
    meta = _dist_info(venv, "idna") / "METADATA"
    args = json.dumps({"verify_files": False, "cache_dir": str(cache)})
    proc = subprocess.run([str(venv / "bin/python"), "-c", _KEPT_AGENT, module_source("distributions")[0], args,
                           str(path), str(meta)], capture_output=True, text=True, check=True)
    first, kept, changed, after, opened = json.loads(proc.stdout)
    assert (first["read"], kept["read"]) == (1, 0)  # the second command: from memory
    assert changed["read"] == 0 and changed["versions"]["idna"].startswith("9")  # the METADATA change is seen
    assert after["read"] == 1 and after["versions"] == changed["versions"]  # the file it saved is read anew
    assert opened["read"] == 1 and opened["ignored"] == "not a private file of this user"
    assert opened["versions"] == after["versions"]
