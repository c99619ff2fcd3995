"""The project config file (issue 31, item 6): an ``ansible.cfg`` in the current folder is honoured as
``ansible`` honours it, ``fleetctl.cfg`` the same; command line > environment > config file > defaults;
keys fleetctl does not read are named with file:line. Host-free: ``hosts --json`` shows what was read."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import run_cli

INVENTORY = "all:\n  hosts:\n    gpu-1:\n      ansible_host: 10.9.9.1\n    gpu-2:\n      ansible_host: 10.9.9.2\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder as the current folder, with an empty home: no config but the test's."""
    monkeypatch.delenv("FLEETCTL_CONFIG", raising=False)
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    monkeypatch.delenv("FLEETCTL_INVENTORY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    folder = tmp_path / "project"
    (folder / "inventory").mkdir(parents=True)
    (folder / "inventory" / "hosts.yml").write_text(INVENTORY)
    monkeypatch.chdir(folder)
    return folder


ANSIBLE_CFG = """\
[defaults]
inventory = inventory/hosts.yml
remote_user = ubuntu
host_key_checking = False   ; Ansible's, not ours
forks = 7
retry_files_enabled = False

[privilege_escalation]
become = True
become_user = svc

[ssh_connection]
pipelining = True
"""


def _login(r: object) -> dict[str, str]:
    return {h["name"]: h["login"] for h in r.json()["hosts"]}  # type: ignore[attr-defined]


def test_an_ansible_cfg_in_the_current_folder_is_honoured(project: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (project / "ansible.cfg").write_text(ANSIBLE_CFG)
    r = run_cli(capsys, "hosts", "--json")
    assert r.rc == 0, r.err
    assert _login(r) == {"gpu-1": {"address": "ubuntu@10.9.9.1:22", "via": [], "become": "svc"},
                         "gpu-2": {"address": "ubuntu@10.9.9.2:22", "via": [], "become": "svc"}}
    # the keys it leaves to Ansible: one line, each with file:line
    assert r.err.strip().splitlines() == [
        f"fleetctl: warning: {project / 'ansible.cfg'}: keys fleetctl does not use (left to Ansible): "
        "ansible.cfg:4: host_key_checking, ansible.cfg:6: retry_files_enabled, ansible.cfg:13: pipelining"]


def test_precedence_command_line_then_environment_then_config(project: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "ansible.cfg").write_text(ANSIBLE_CFG)
    other = tmp_path / "other.yml"
    other.write_text("all:\n  hosts:\n    solo:\n      ansible_host: 10.9.9.9\n")
    monkeypatch.setenv("FLEETCTL_INVENTORY", str(other))
    assert list(_login(run_cli(capsys, "hosts", "--json"))) == ["solo"]  # env beats the config file
    r = run_cli(capsys, "-i", "inventory/hosts.yml", "hosts", "-l", "gpu-1", "-u", "root", "--json")
    assert _login(r)["gpu-1"]["address"] == "root@10.9.9.1:22"  # the command line beats both


def test_fleetctl_cfg_first_and_strict(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "ansible.cfg").write_text(ANSIBLE_CFG)
    (project / "fleetctl.cfg").write_text("[defaults]\ninventory = inventory/hosts.yml\nremote_user = ops\n")
    r = run_cli(capsys, "hosts", "-l", "gpu-2", "--json")
    assert r.rc == 0 and r.err == ""
    assert _login(r)["gpu-2"] == {"address": "ops@10.9.9.2:22", "via": [], "become": None}
    (project / "fleetctl.cfg").write_text("[defaults]\ninventory = inventory/hosts.yml\n\nremote_usr = ops\n")
    bad = run_cli(capsys, "hosts")
    assert bad.rc == 3
    assert bad.err.strip() == (f"fleetctl: error: {project / 'fleetctl.cfg'}:4: unknown key 'remote_usr' (known: "
                               "inventory, remote_user, private_key_file, forks, vault_password_file, become, "
                               "become_user)")


def test_config_named_by_environment_or_none(project: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    named = tmp_path / "elsewhere.cfg"
    named.write_text(f"[defaults]\ninventory = {project / 'inventory' / 'hosts.yml'}\nremote_user = far\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(named))
    assert _login(run_cli(capsys, "hosts", "-l", "gpu-1", "--json"))["gpu-1"]["address"] == "far@10.9.9.1:22"
    monkeypatch.setenv("FLEETCTL_CONFIG", "none")
    r = run_cli(capsys, "hosts")
    assert r.rc == 3 and "no inventory" in r.err
