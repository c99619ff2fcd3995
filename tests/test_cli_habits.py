"""CLI habits of Ansible users (issue 31, item 6): global options after the command, ``-e`` parsed as
``ansible-playbook`` parses it, ``hosts`` showing the login the transport will use, and no
implicit ``FLEETCTL_<OPTION>`` environment variables. No host is contacted except the local one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import run_cli

INVENTORY = """\
all:
  hosts:
    ctl:
      ansible_connection: local
      ansible_python_interpreter: /usr/bin/python3
    gpu-07: {}
    other:
      ansible_host: 10.9.9.8
"""


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inv.yml"
    path.write_text(INVENTORY)
    return path


def test_global_options_after_the_command(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "ping", "-i", str(inv), "-l", "ctl", "--json", "-T", "30", "-f", "2")
    assert r.rc == 0, r.err
    assert r.json()["hosts"]["ctl"]["status"] == "ok"
    # -u and -b after the command reach the resolver; the command's value wins over the group's.
    r = run_cli(capsys, "-i", str(inv), "-u", "before", "hosts", "-l", "other", "-u", "ubuntu", "-b",
                "--become-user", "svc", "--json")
    assert r.rc == 0, r.err
    assert r.json()["hosts"][0]["login"] == {"address": "ubuntu@10.9.9.8:22", "via": [], "become": "svc"}
    # -e after the command too, and after `hosts trust`'s group
    r = run_cli(capsys, "-i", str(inv), "-e", "a=1", "hosts", "-l", "ctl", "-e", "a=2", "-e", "b=3", "--json")
    assert {k: r.json()["hosts"][0]["vars"][k] for k in "ab"} == {"a": "2", "b": "3"}


def test_run_takes_the_inventory_after_the_playbook(inv: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    book = tmp_path / "book.yml"
    book.write_text("- hosts: all\n  tasks:\n    - name: say\n      shell: echo {{ greeting }}-{{ n }}\n"
                    "      register: said\n")
    r = run_cli(capsys, "run", str(book), "-i", str(inv), "-l", "ctl", "-e", "greeting=hi n=1.10", "--json")
    assert r.rc == 0, r.out + r.err
    assert r.json()["status"] == "ok"


def test_a_commands_own_flag_keeps_its_meaning_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    grep = run_cli(capsys, "probe", "grep", "--help")
    assert "-i, --ignore-case" in grep.out
    assert "-i (here: this command's own -i), give it before the command" in " ".join(grep.out.split())
    logs = run_cli(capsys, "logs", "--help")
    assert "-f (here: this command's own -f)" in " ".join(logs.out.split())


@pytest.mark.parametrize(("given", "expected"), [
    (["v=1.10"], {"v": "1.10"}),
    (["o=0755"], {"o": "0755"}),
    (["b=yes"], {"b": "yes"}),
    (["x=1 y=2"], {"x": "1", "y": "2"}),
    (["msg='a b' n=3"], {"msg": "a b", "n": "3"}),
    (['{"x": 1, "l": [1, 2]}'], {"x": 1, "l": [1, 2]}),
    (["{x: 1.10}"], {"x": 1.1}),  # a YAML mapping is typed, as in Ansible
    (["x=1", "x=2"], {"x": "2"}),
])
def test_extra_vars_as_ansible_parses_them(inv: Path, capsys: pytest.CaptureFixture[str], given: list[str],
                                           expected: dict[str, object]) -> None:
    args = [a for value in given for a in ("-e", value)]
    r = run_cli(capsys, "-i", str(inv), *args, "hosts", "-l", "ctl", "--json")
    assert r.rc == 0, r.err
    got = r.json()["hosts"][0]["vars"]
    assert {k: got[k] for k in expected} == expected


def test_extra_vars_from_a_file_and_bad_ones(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "vars.json").write_text(json.dumps({"n": 4, "s": "0755"}))
    r = run_cli(capsys, "-i", str(inv), "-e", f"@{tmp_path / 'vars.json'}", "hosts", "-l", "ctl", "--json")
    assert {k: r.json()["hosts"][0]["vars"][k] for k in "ns"} == {"n": 4, "s": "0755"}
    bad = run_cli(capsys, "-i", str(inv), "-e", "x=1 lonely", "hosts")
    assert bad.rc == 3 and "'lonely' is not KEY=VALUE" in bad.err
    assert run_cli(capsys, "-i", str(inv), "-e", "[1, 2]", "hosts").rc == 3


def test_hosts_shows_the_login_the_transport_uses(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu-07\n  HostName 10.9.9.7\n  User ubuntu\n  Port 2222\n  ProxyJump jump@bast:2200\n")
    monkeypatch.setenv("FLEETCTL_SSH_CONFIG", str(config))
    r = run_cli(capsys, "-i", str(inv), "hosts", "-l", "gpu-07,other")
    assert r.rc == 0, r.err
    lines = {line.split()[1]: line for line in r.out.splitlines() if line.startswith("│")}
    assert "ubuntu@10.9.9.7:2222 via jump@bast:2200" in lines["gpu-07"]
    assert "None" not in r.out
    doc = run_cli(capsys, "-i", str(inv), "hosts", "-l", "gpu-07", "--json").json()
    assert doc["hosts"][0]["login"] == {"address": "ubuntu@10.9.9.7:2222", "via": ["jump@bast:2200"],
                                        "become": None}


def test_no_implicit_environment_variables(inv: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_LIMIT", "ctl")  # stale, from another shell session
    monkeypatch.setenv("FLEETCTL_HOSTS_LIMIT", "ctl")
    monkeypatch.setenv("FLEETCTL_FORKS", "nonsense")
    r = run_cli(capsys, "-i", str(inv), "hosts", "--json")
    assert r.rc == 0, r.err
    assert [h["name"] for h in r.json()["hosts"]] == ["ctl", "gpu-07", "other"]
    # the ones kept are named in --help
    help_text = " ".join(run_cli(capsys, "--help").out.split())
    for var in ("FLEETCTL_INVENTORY", "FLEETCTL_PERSIST", "FLEETCTL_VAULT_PASSWORD_FILE", "FLEETCTL_CONFIG"):
        assert var in help_text
    monkeypatch.setenv("FLEETCTL_INVENTORY", str(inv))
    assert run_cli(capsys, "hosts", "-l", "ctl", "--json").json()["hosts"][0]["name"] == "ctl"
