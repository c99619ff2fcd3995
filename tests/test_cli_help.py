"""What `fleetctl --help` and the shell's completion give an operator: examples, the rule for global
options, every command's summary whole, the lab harness out of the list; hosts, groups, release ids
and run ids completed from the inventory and the run journals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from cli_support import run_cli
from click.shell_completion import ShellComplete

from fleetctl.cli.main import cli

INVENTORY = """\
all:
  children:
    gpu:
      hosts:
        ct129: {ansible_host: 10.0.0.1}
        ct130: {ansible_host: 10.0.0.2}
    canary:
      hosts:
        ct129: {}
"""
OLD_RELEASE = "sglang-0.5.9-0123abcd"
NEW_RELEASE = "ddtree-sglang-0.5.23-89abcdef"


def _groups(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    ctx = click.Context(cli)
    out = []
    if isinstance(command, click.Group):
        out.append(path)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None
            out += _groups(sub, (*path, name))
    return out


def test_help_has_examples_the_global_option_rule_and_completion(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "--help")
    assert r.rc == 0
    text = " ".join(r.out.split())
    assert "Global options (the ones below) go before the command" in text
    assert "fleetctl -i inv.yml -l gpu ping" in r.out
    assert "_FLEETCTL_COMPLETE=bash_source fleetctl" in text


def test_no_command_summary_is_cut(capsys: pytest.CaptureFixture[str]) -> None:
    groups = _groups(cli)
    assert ("runs",) in groups and ("probe",) in groups
    for path in groups:
        r = run_cli(capsys, *path, "--help")
        assert r.rc == 0, (path, r.err)
        listing = r.out.split("Commands:", 1)[1].split("\n\n", 1)[0]
        assert "..." not in listing, (path, listing)


def test_the_lab_harness_is_hidden_but_still_runs(capsys: pytest.CaptureFixture[str]) -> None:
    listing = run_cli(capsys, "--help").out.split("Commands:", 1)[1]
    assert "\n  lab " not in listing
    assert "\n  ping " in listing
    r = run_cli(capsys, "lab", "--help")
    assert r.rc == 0 and "up" in r.out and "down" in r.out


@pytest.fixture
def fleet_folder(tmp_path: Path) -> Path:
    (tmp_path / "inventory.yml").write_text(INVENTORY)
    runs = tmp_path / ".fleetctl" / "runs"
    runs.mkdir(parents=True)
    older = [{"event": "run_start", "run_id": "20261201-100000-deploy-ddtree"},
             {"event": "recorded", "play": 1, "releases": {"ct129": OLD_RELEASE}},
             {"event": "task_result", "host": "ct129", "msg": f"deployed {NEW_RELEASE} (was {OLD_RELEASE})"}]
    (runs / "20261201-100000-deploy-ddtree.jsonl").write_text("".join(json.dumps(e) + "\n" for e in older))
    (runs / "20261202-090000-rollback.jsonl").write_text(json.dumps({"event": "run_start"}) + "\n")
    return tmp_path


def _complete(args: list[str], incomplete: str) -> list[str]:
    shell = ShellComplete(cli, {}, "fleetctl", "_FLEETCTL_COMPLETE")
    return [item.value for item in shell.get_completions(args, incomplete)]


def test_limit_completes_hosts_and_groups_in_a_pattern(fleet_folder: Path) -> None:
    inv = str(fleet_folder / "inventory.yml")
    assert _complete(["-i", inv, "-l"], "") == ["all", "canary", "gpu", "ungrouped", "ct129", "ct130"]
    assert _complete(["-i", inv, "-l"], "c") == ["canary", "ct129", "ct130"]
    assert _complete(["-i", inv, "-l"], "gpu:!ct13") == ["gpu:!ct130"]
    assert _complete(["-i", inv, "ping", "-l"], "gpu,can") == ["gpu,canary"]  # -l after the command too
    assert _complete(["-i", inv, "drift", "--baseline"], "ct") == ["ct129", "ct130"]


def test_release_and_run_ids_complete_from_the_journals(fleet_folder: Path) -> None:
    inv = str(fleet_folder / "inventory.yml")
    assert _complete(["-i", inv, "rollback", "--to"], "") == [NEW_RELEASE, OLD_RELEASE]
    assert _complete(["-i", inv, "releases", "remove"], "sg") == [OLD_RELEASE]
    runs = ["20261202-090000-rollback", "20261201-100000-deploy-ddtree"]
    assert _complete(["-i", inv, "runs", "show"], "") == runs
    assert _complete(["-i", inv, "runs", "promote"], "20261201") == runs[1:]
    assert _complete(["-i", inv, "run", "book.yml", "--resume"], "") == runs


def test_completion_never_prints_an_error(tmp_path: Path) -> None:
    (tmp_path / "bad.yml").write_text("all: [unclosed\n")
    assert _complete(["-i", str(tmp_path / "bad.yml"), "-l"], "") == []
    assert _complete(["-i", str(tmp_path / "bad.yml"), "runs", "show"], "") == []


def test_bash_completion_through_the_installed_entry_point(fleet_folder: Path) -> None:
    fleetctl = Path(sys.executable).with_name("fleetctl")
    inv = str(fleet_folder / "inventory.yml")
    env = {**os.environ, "_FLEETCTL_COMPLETE": "bash_complete", "COMP_WORDS": f"fleetctl -i {inv} -l gp",
           "COMP_CWORD": "4", "FLEETCTL_CONFIG": "none"}
    done = subprocess.run([str(fleetctl)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout.split(), done.stderr) == (0, ["plain,gpu"], "")
    script = subprocess.run([str(fleetctl)], env={**os.environ, "_FLEETCTL_COMPLETE": "bash_source"},
                            capture_output=True, text=True, timeout=60, check=False)
    assert "complete -o nosort -F _fleetctl_completion fleetctl" in script.stdout
