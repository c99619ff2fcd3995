"""The CLI in-process: exit codes, one-line errors, local connection without paramiko."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import run_cli

LOCAL_INVENTORY = """\
all:
  hosts:
    ctl:
      ansible_connection: local
      ansible_python_interpreter: /usr/bin/python3
"""


@pytest.fixture
def local_inventory(tmp_path: Path) -> Path:
    path = tmp_path / "local.yml"
    path.write_text(LOCAL_INVENTORY)
    return path


def test_local_connection_runs_without_ssh_or_paramiko(local_inventory: Path) -> None:
    code = (
        "import sys; from fleetctl.cli.main import main; rc = main(['-i', sys.argv[1], 'ping', '--json']);"
        "assert 'paramiko' not in sys.modules and 'fabric' not in sys.modules, 'ssh stack imported';"
        "sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(local_inventory)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert '"status": "ok"' in proc.stdout
    assert '"python": "/usr/bin/python3"' in proc.stdout


def test_help_does_not_import_the_ssh_stack() -> None:
    code = (
        "import sys; from fleetctl.cli.main import main; main(['--help']);"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('paramiko', 'fabric', 'rich')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip().endswith("[]"), proc.stdout


def test_shell_on_local_host(local_inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(local_inventory), "-l", "all", "shell", "--json", "echo hi; echo err >&2")
    assert r.rc == 0
    assert r.json()["hosts"]["ctl"]["value"]["stdout"] == "hi\n"
    assert r.json()["hosts"]["ctl"]["value"]["stderr"] == "err\n"


def test_facts_local(local_inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(local_inventory), "facts", "--json")
    assert r.rc == 0, r.err
    facts = r.json()["hosts"]["ctl"]["value"]
    assert facts["memory_total"] > 0


def test_no_inventory_is_a_usage_error(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETCTL_INVENTORY", raising=False)
    r = run_cli(capsys, "ping")
    assert r.rc == 3
    assert r.err.strip() == ("fleetctl: error: no inventory: pass -i PATH, set FLEETCTL_INVENTORY or 'inventory' in "
                          "fleetctl.cfg/ansible.cfg")


def test_inventory_from_environment(local_inventory: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_INVENTORY", str(local_inventory))
    r = run_cli(capsys, "hosts", "--json")
    assert r.rc == 0
    assert [h["name"] for h in r.json()["hosts"]] == ["ctl"]


@pytest.mark.parametrize("sep", [",", ":"])
def test_inventory_list_from_environment_and_several_i(local_inventory: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch, sep: str) -> None:
    ini = local_inventory.parent / "more.ini"
    ini.write_text("[gpu]\nct1 ansible_connection=local\n")
    monkeypatch.setenv("FLEETCTL_INVENTORY", f"{local_inventory}{sep}{ini}")
    r = run_cli(capsys, "hosts", "--json")
    assert r.rc == 0, r.err
    assert [h["name"] for h in r.json()["hosts"]] == ["ct1", "ctl"]
    monkeypatch.delenv("FLEETCTL_INVENTORY")
    r = run_cli(capsys, "-i", str(ini), "-i", str(local_inventory), "-l", "gpu", "hosts", "--json")
    assert [h["name"] for h in r.json()["hosts"]] == ["ct1"]


def test_bad_option_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "--forks", "0", "ping")
    assert r.rc == 3
    assert "--forks" in r.err


def test_malformed_inventory_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("all:\n  hosts:\n    a:\n  hostz:\n    b:\n")
    r = run_cli(capsys, "-i", str(bad), "hosts")
    assert r.rc == 3
    assert r.err.startswith(f"fleetctl: error: {bad}:4:")
    assert len(r.err.strip().splitlines()) == 1


def test_pattern_matching_nothing_lists_groups(local_inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(local_inventory), "-l", "gpu", "ping")
    assert r.rc == 3
    assert "no hosts match 'gpu'" in r.err


def test_extra_vars_override(local_inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(local_inventory), "-e", "venv=/opt/x", "-e", "service_port=31000",
                "hosts", "--json")
    host = r.json()["hosts"][0]
    assert host["vars"]["venv"] == "/opt/x"
    assert host["vars"]["service_port"] == "31000"  # -e k=v: a string, as in Ansible


def test_secret_vars_are_masked_in_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  vars:\n    secret_vars: [HF_TOKEN]\n    HF_TOKEN: hf_realsecret\n"
                   "  hosts:\n    ctl: {ansible_connection: local}\n")
    r = run_cli(capsys, "-i", str(inv), "hosts", "--json")
    assert r.json()["hosts"][0]["vars"]["HF_TOKEN"] == "********"
    assert "hf_realsecret" not in r.out + r.err
