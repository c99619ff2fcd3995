"""`-e` variables that nothing reads are reported (issue 32 P9): one warning line before the run,
naming each with the variable it was probably meant to be; a variable read anywhere the run can
reach (the playbook, a bare `when:`, a template or release spec beside it, the inventory's
group_vars, a host var fleetctl reads) is never named."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import run_cli

from fleetctl.playbook.unread_vars import unread_warning

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = """\
- name: the release
  hosts: "{{ target | default('all') }}"
  vars:
    spec_file: "{{ release_spec | default('releases/production.yml') }}"
  tasks:
    - name: which spec
      debug: {msg: "{{ spec_file }}"}
    - name: canary only
      debug: {msg: canary}
      when: canary_only | default(false)
"""


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "playbooks" / "templates").mkdir(parents=True)
    playbook = tmp_path / "playbooks" / "site.yml"
    playbook.write_text(PLAYBOOK)
    (tmp_path / "playbooks" / "templates" / "server.conf.j2").write_text("tp = {{ tp_size }}\n")
    (tmp_path / "inventory" / "group_vars").mkdir(parents=True)
    (tmp_path / "inventory" / "group_vars" / "all.yml").write_text("zone: \"{{ region }}-a\"\n")
    inv = tmp_path / "inventory" / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    ctl: {ansible_connection: local, "
                   "ansible_python_interpreter: /usr/bin/python3}\n")
    return playbook, inv


def test_a_misspelled_extra_var_is_named_in_one_line(project: tuple[Path, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    playbook, inv = project
    used = ["-e", "target=all", "-e", "canary_only=false", "-e", "tp_size=4", "-e", "region=eu",
            "-e", "ansible_user=root", "-e", "venv=/opt/env"]
    r = run_cli(capsys, "-i", str(inv), "run", str(playbook), "--check", "-e", "relase_spec=releases/lab.yml", *used)
    assert r.rc == 0, r.out + r.err
    warnings = [line for line in r.err.splitlines() if "warning" in line]
    assert warnings == [f"fleetctl: warning: -e relase_spec (did you mean release_spec?): no template of {playbook}, "
                        "the files beside it or the inventory reads it, nor does fleetctl; it changes nothing"], r.err
    assert "releases/production.yml" in r.out  # what the warning is about: the default was used
    clean = run_cli(capsys, "-i", str(inv), "run", str(playbook), "--check", "-e", "release_spec=releases/lab.yml",
                    *used)
    assert clean.rc == 0 and "warning" not in clean.err, clean.err
    assert "releases/lab.yml" in clean.out
    before = run_cli(capsys, "-i", str(inv), "-e", "tp_sise=8", "run", str(playbook), "--check")  # global -e
    assert before.rc == 0 and "fleetctl: warning: -e tp_sise (did you mean tp_size?): " in before.err, before.err


def test_the_shipped_rollout_names_a_misspelled_release_spec() -> None:
    playbook, inv = REPO / "playbooks" / "deploy-ddtree.yml", [REPO / "inventory" / "example.yml"]
    assert unread_warning(["target", "release_spec"], playbook, inv) is None
    line = unread_warning(["target", "relase"], playbook, inv)
    assert line is not None and line.startswith("-e relase (did you mean release_spec?): "), line
