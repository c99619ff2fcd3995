"""End to end on the lab fleet (real sshd, real sglang venvs): probe grep and probe symbol.

lab1 and lab3 run sglang 0.5.23 in /root/ml-env, lab2 runs 0.5.9 (see sglang_support.LAYOUT).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from cli_support import CliRun, run_cli
from lab_support import LabHandle

pytestmark = pytest.mark.lab

VENV = "/root/ml-env"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
HYBRID_LINEAR = "sglang/srt/layers/attention/hybrid_linear_attn_backend.py"
TERMS = ("update_mamba_state_after_mtp_verify", "disable_state_update", "mamba_intermediate", "Mamba")
# Matching lines under sglang/srt of each release (the same numbers a line-by-line search gives).
NEW_COUNTS = {"update_mamba_state_after_mtp_verify": 16, "disable_state_update": 10, "mamba_intermediate": 22,
              "Mamba": 825}
OLD_COUNTS = {"update_mamba_state_after_mtp_verify": 3, "disable_state_update": 19, "mamba_intermediate": 11,
              "Mamba": 196}


def probe(lab: LabHandle, capsys: pytest.CaptureFixture[str], *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(lab.inventory_path), "probe", *args)


def table_row(out: str, first_cell: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(f"│ {first_cell} "))
    return [cell.strip() for cell in line.strip("│").split("│")]


def test_symbol_dflash_defined_on_new_release_only(sglang_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = probe(sglang_lab, capsys, "symbol", "SpeculativeAlgorithm.DFLASH", "--venv", VENV, "--json")
    assert r.rc == 0, r.err
    hosts = r.json()["hosts"]
    for name in ("lab1", "lab3"):
        (definition,) = hosts[name]["value"]["definitions"]
        assert (definition["path"], definition["line"], definition["kind"], definition["scope"]) == (
            SPEC_INFO, 39, "enum member", "SpeculativeAlgorithm")
        assert (SPEC_INFO, 118) in {(x["path"], x["line"]) for x in hosts[name]["value"]["references"]}
    assert hosts["lab2"]["value"]["definitions"] == hosts["lab2"]["value"]["references"] == []

    gate = probe(sglang_lab, capsys, "symbol", "SpeculativeAlgorithm.DFLASH", "--venv", VENV, "--expect", "present")
    assert gate.rc == 1
    assert "expected a definition of SpeculativeAlgorithm.DFLASH present, but not on: lab2" in gate.err
    assert "── lab1,lab3 (2) ──" in gate.out
    assert f"{SPEC_INFO}:39: DFLASH = auto()  (enum member in SpeculativeAlgorithm)" in gate.out
    assert table_row(gate.out, "lab1") == ["lab1", "1", "5", "0"]
    assert table_row(gate.out, "lab2") == ["lab2", "0", "0", "0"]


def test_symbol_definitions_apart_from_call_sites(sglang_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = probe(sglang_lab, capsys, "symbol", "update_mamba_state_after_mtp_verify", "--venv", VENV, "--json")
    assert r.rc == 0, r.err
    new = r.json()["hosts"]["lab1"]["value"]
    assert (HYBRID_LINEAR, "method", "HybridLinearAttnBackend") in {
        (d["path"], d["kind"], d["scope"]) for d in new["definitions"]}
    assert len({d["path"] for d in new["definitions"]}) == 5  # the other backends define it too
    assert {x["kind"] for x in new["references"]} == {"call"}
    old = r.json()["hosts"]["lab2"]["value"]
    assert [(d["path"], d["line"]) for d in old["definitions"]] == [(HYBRID_LINEAR, 1695)]
    assert [(x["path"], x["line"], x["scope"]) for x in old["references"]] == [
        ("sglang/srt/speculative/eagle_worker.py", 855, "EAGLEWorker._mamba_verify_update"),
        ("sglang/srt/speculative/multi_layer_eagle_worker.py", 574, "MultiLayerEagleWorker.verify")]

    human = probe(sglang_lab, capsys, "symbol", "update_mamba_state_after_mtp_verify", "--venv", VENV, "-l", "lab2")
    defined, referenced = human.out.index("defined (1)"), human.out.index("referenced (2)")
    assert defined < human.out.index(f"{HYBRID_LINEAR}:1695:") < referenced
    assert referenced < human.out.index("eagle_worker.py:855:")


def test_grep_counts_differ_between_releases(sglang_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    args = ("grep", *TERMS, "--subpath", "srt", "--venv", VENV)
    r = probe(sglang_lab, capsys, *args, "--json")
    assert r.rc == 0, r.err
    doc = r.json()
    assert doc["matrix"] == {t: {"lab1": NEW_COUNTS[t], "lab2": OLD_COUNTS[t], "lab3": NEW_COUNTS[t]} for t in TERMS}
    lab1 = doc["hosts"]["lab1"]["value"]
    assert lab1["shown"] == 200 and lab1["truncated"] and lab1["matched_lines"] == 869

    human = probe(sglang_lab, capsys, *args, "--max-hits", "3")
    assert human.rc == 0
    assert "── lab1,lab3 (2) ── 869 matching lines" in human.out
    assert "866 more matching lines not shown (--max-hits 3)" in human.out
    assert table_row(human.out, "update_mamba_state_after_mtp_verify")[1:] == ["16", "3", "16"]
    assert table_row(human.out, "Mamba")[1:] == ["825", "196", "825"]


def test_repeated_grep_reads_no_unchanged_file(sglang_lab: LabHandle,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Through the real agent: the host keeps what a search learnt in /var/lib/fleetctl/cache (root's,
    0600), the next search with the same terms answers the same without reading a file; --no-cache
    reads every file again."""
    args = ("grep", *TERMS, "--subpath", "srt", "--venv", VENV, "--json", "-l", "lab1,lab2")
    sglang_lab.ssh("lab1", "rm -f /var/lib/fleetctl/cache/grep-*.marshal")
    time.sleep(2.1)  # the venvs' files have been still for 2 s: the grep cache trusts their stat only then
    first, second, fresh = (probe(sglang_lab, capsys, *args, *extra).json()["hosts"]
                            for extra in ((), (), ("--no-cache",)))
    for host, counts in (("lab1", NEW_COUNTS), ("lab2", OLD_COUNTS)):
        assert first[host]["value"]["counts"] == second[host]["value"]["counts"] == counts
        assert first[host]["value"]["files"] == second[host]["value"]["files"] == fresh[host]["value"]["files"]
        value = second[host]["value"]
        # Every file answered from the cache but those whose inode changed in the last seconds (a hard link
        # made or dropped by a release build elsewhere on the host changes ctime): never learnt, read again.
        every = value["searched_files"] + value["binary_files"]
        assert every - 50 <= value["cached_files"] <= every and value["cached_files"] > 1000, value
        assert fresh[host]["value"]["cached_files"] == 0
    assert first["lab1"]["value"]["cached_files"] == 0
    kept = sglang_lab.ssh("lab1", "stat -c '%U %a %n' /var/lib/fleetctl/cache/grep-*.marshal").stdout.split()
    assert kept[:2] == ["root", "600"]


def test_grep_ignore_case_finds_lowercase(sglang_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = probe(sglang_lab, capsys, "grep", "-i", "Mamba", "--subpath", "srt", "--venv", VENV, "--json", "-l", "lab2")
    assert r.rc == 0, r.err
    value = r.json()["hosts"]["lab2"]["value"]
    assert value["counts"]["Mamba"] > OLD_COUNTS["Mamba"]
    texts = [h["text"] for f in value["files"] for h in f["hits"]]
    assert any("mamba" in t and "Mamba" not in t for t in texts)


def test_expect_present_names_hosts_missing_a_term(sglang_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = probe(sglang_lab, capsys, "grep", "DFLASH", "Mamba", "--subpath", "srt/speculative", "--venv", VENV,
              "--max-hits", "0", "--expect", "present")
    assert r.rc == 1
    assert "expected every term present, but not on: lab2" in r.err
    assert table_row(r.out, "DFLASH")[2] == "0"


def test_bad_input_per_host(sglang_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    missing = probe(sglang_lab, capsys, "grep", "x", "--package", "nosuchpkg", "--venv", VENV, "--json")
    assert missing.rc == 2
    for entry in missing.json()["hosts"].values():
        assert entry["status"] == "failed"
        assert entry["reason"].startswith("nosuchpkg is not installed for /root/ml-env/bin/python (Python 3.")
    # A folder only the new release has: lab2 fails with why, lab1 and lab3 answer.
    only_new = probe(sglang_lab, capsys, "grep", "Mamba", "--subpath", "srt/arg_groups", "--venv", VENV, "--json")
    assert only_new.rc == 2
    hosts = only_new.json()["hosts"]
    assert hosts["lab2"]["reason"].startswith("subpath srt/arg_groups not found in /root/ml-env/lib/python3.")
    assert hosts["lab1"]["status"] == hosts["lab3"]["status"] == "ok"
    bad_regex = probe(sglang_lab, capsys, "grep", "--regex", "mamba(")
    assert bad_regex.rc == 3  # refused once, before connecting: it would fail the same on every host
    assert "invalid regex 'mamba(': missing ), unterminated subpattern" in bad_regex.err


def test_missing_venv_fails_only_that_host(sglang_lab: LabHandle, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(sglang_lab.inventory_path.read_text())
    doc["all"]["vars"] = {"fleetctl_known_hosts": str(sglang_lab.known_hosts)}
    for name, host in doc["all"]["children"]["lab"]["hosts"].items():
        host["ansible_ssh_private_key_file"] = str(sglang_lab.key_path)
        host["venv"] = "/root/nope" if name == "lab2" else VENV
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(doc))
    r = run_cli(capsys, "-i", str(inventory), "probe", "symbol", "SpeculativeAlgorithm")
    assert r.rc == 2
    assert "lab2: failed: no python at /root/nope/bin/python: is venv /root/nope there on this host?" in " ".join(
        r.err.split())
    assert table_row(r.out, "lab1")[1] == "1" and table_row(r.out, "lab3")[1] == "1"
    assert table_row(r.out, "lab2")[1] == "failed"
