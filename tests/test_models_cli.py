"""``fleetctl models`` on local hosts (the real agent, no SSH): exit codes, the one line per flawed file
naming host, model and file, --json, and the one-line refusals of a bad target."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import CliRun, run_cli
from model_support import MadeModel, make_folder_model, truncate

from fleetctl.models import manifest as mf

LOCAL = """\
all:
  hosts:
    one: {ansible_connection: local, ansible_python_interpreter: /usr/bin/python3, fleetctl_state_dir: STATE1}
    two: {ansible_connection: local, ansible_python_interpreter: /usr/bin/python3, fleetctl_state_dir: STATE2}
"""


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yml"
    path.write_text(LOCAL.replace("STATE1", str(tmp_path / "s1")).replace("STATE2", str(tmp_path / "s2")))
    return path


@pytest.fixture
def model(tmp_path: Path) -> MadeModel:
    made = make_folder_model(tmp_path / "models" / "tiny")
    mf.dump(mf.build_from_folder(made.path), mf.manifest_path("folder", str(made.path)))
    return made


def cli(capsys: pytest.CaptureFixture[str], inv: Path, *args: str, limit: str = "all") -> CliRun:
    return run_cli(capsys, "-i", str(inv), "-l", limit, *args)


def test_status_of_an_intact_folder_is_0_with_a_row_per_host(inv: Path, model: MadeModel,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, inv, "models", "status", str(model.path))
    assert r.rc == 0, r.out + r.err
    rows = [line for line in r.out.splitlines() if " tiny " in line]
    assert len(rows) == 2 and all(" ok " in row and "never" in row for row in rows)
    v = cli(capsys, inv, "models", "verify", str(model.path), "--json")
    assert v.rc == 0 and {m["state"] for h in v.json()["hosts"].values() for m in h["value"]} == {"ok"}
    assert all(h["value"][0]["verified_at"] for h in v.json()["hosts"].values())  # each host's own hashes
    again = cli(capsys, inv, "models", "status", str(model.path))
    assert "never" not in again.out and ("ago" in again.out or "just now" in again.out)


def test_a_truncated_shard_exits_1_naming_host_model_and_file(inv: Path, model: MadeModel,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    truncate(model.path / model.shards[0])
    r = cli(capsys, inv, "models", "status", str(model.path))
    assert r.rc == 1
    for host in ("one", "two"):
        assert f"{host}: model tiny: {model.path / model.shards[0]}: size " in r.err
    assert "Traceback" not in r.out + r.err


def test_an_absent_model_is_missing(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, inv, "models", "status", str(tmp_path / "nowhere"), "--json")
    assert r.rc == 1
    assert {m["state"] for h in r.json()["hosts"].values() for m in h["value"]} == {"missing"}


@pytest.mark.parametrize("target, says", [
    ("relative/folder", "is an absolute path"),
    ("SPEC_NO_MODELS", "names no models"),
])
def test_a_bad_target_is_one_line_exit_3(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         target: str, says: str) -> None:
    if target == "SPEC_NO_MODELS":
        spec = tmp_path / "plain.yml"
        spec.write_text("name: p\nversion: '1'\nbase: {adopt: /root/ml-env}\n")
        target = str(spec)
    r = cli(capsys, inv, "models", "status", target)
    assert r.rc == 3 and says in r.err and len(r.err.strip().splitlines()) == 1


def test_remove_deletes_the_folder(inv: Path, model: MadeModel,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, inv, "-y", "models", "remove", str(model.path), "--json", limit="one")
    assert r.rc == 0, r.out + r.err
    assert r.json()["hosts"]["one"]["value"][0]["removed"] and not model.path.exists()
