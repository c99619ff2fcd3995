"""How inventory vars, CLI options and ssh_config combine into one host's target (pure, no SSH)."""

from __future__ import annotations

import getpass
import textwrap
from pathlib import Path

import pytest

from fleetctl.errors import InputError
from fleetctl.inventory import Inventory, load_inventory
from fleetctl.transport import ssh_config
from fleetctl.transport.target import Become, ConnectOptions, SSHTarget, resolve_become, resolve_target

CONFIG = """\
Host ct129
  HostName 10.1.0.129
  User fleetop
  Port 2222
  IdentityFile ~/.ssh/fleet_ed25519
Host bastion
  HostName 10.1.0.1
  User jump
Host behind
  HostName 10.2.0.5
  ProxyJump bastion
Host deep
  HostName 10.3.0.7
  ProxyJump bastion,ops@10.2.0.9:2200
Host piped
  ProxyCommand nc -X connect %h %p
Host loop-a
  ProxyJump loop-b
Host loop-b
  ProxyJump loop-a
"""


def inventory(tmp_path: Path, hosts: str) -> Inventory:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n" + textwrap.indent(textwrap.dedent(hosts), "    "))
    return load_inventory(path)


def target(tmp_path: Path, hosts: str, name: str, options: ConnectOptions | None = None,
           config: str = CONFIG) -> SSHTarget:
    inv = inventory(tmp_path, hosts)
    parsed = ssh_config.parse(config, "test config")
    return resolve_target(inv, inv.hosts[name].connection, options or ConnectOptions(), config=parsed)


def test_ssh_config_decides_what_the_inventory_leaves_unset(tmp_path: Path) -> None:
    t = target(tmp_path, "ct129:\n", "ct129")
    assert (t.hostname, t.port, t.user) == ("10.1.0.129", 2222, "fleetop")
    assert t.key_files == (str(Path("~/.ssh/fleet_ed25519").expanduser()),)
    assert not t.look_for_keys and t.allow_agent  # a named key, with ssh-agent alongside


def test_inventory_vars_beat_the_cli_which_beats_ssh_config(tmp_path: Path) -> None:
    cli = ConnectOptions(user="clio", private_key="/keys/cli")
    assert target(tmp_path, "ct129:\n", "ct129", cli).user == "clio"
    t = target(tmp_path, "ct129:\n  ansible_user: invo\n  ansible_port: 22\n"
                         "  ansible_ssh_private_key_file: /keys/inv\n", "ct129", cli)
    assert (t.user, t.port) == ("invo", 22)
    assert t.key_files == ("/keys/inv", str(Path("~/.ssh/fleet_ed25519").expanduser()))


def test_without_inventory_user_or_ssh_config_the_user_is_the_local_one(tmp_path: Path) -> None:
    t = target(tmp_path, "gpu1:\n  ansible_host: 10.9.9.9\n", "gpu1")
    assert (t.hostname, t.port, t.user) == ("10.9.9.9", 22, getpass.getuser())
    assert t.look_for_keys and t.key_files == ()  # OpenSSH's default key files


def test_ssh_config_is_matched_on_ansible_host_as_ssh_is_given_it(tmp_path: Path) -> None:
    t = target(tmp_path, "gpu1:\n  ansible_host: ct129\n", "gpu1")
    assert (t.hostname, t.user) == ("10.1.0.129", "fleetop")


def test_proxy_jump_from_ssh_config_resolves_the_bastion_through_ssh_config(tmp_path: Path) -> None:
    t = target(tmp_path, "behind:\n  ansible_user: fleetop\n", "behind")
    assert t.jump is not None and (t.jump.hostname, t.jump.user, t.jump.port) == ("10.1.0.1", "jump", 22)
    assert t.jump.jump is None


def test_a_chain_goes_hop_by_hop_first_hop_first(tmp_path: Path) -> None:
    t = target(tmp_path, "deep:\n", "deep")
    second = t.jump
    assert second is not None and (second.hostname, second.port, second.user) == ("10.2.0.9", 2200, "ops")
    first = second.jump
    assert first is not None and (first.hostname, first.user) == ("10.1.0.1", "jump")
    assert first.jump is None


def test_an_inventory_chain_and_its_hops(tmp_path: Path) -> None:
    hosts = "hop1:\n  ansible_host: 10.5.0.1\n  ansible_user: ops\ngpu:\n  jump_host: hop1,bastion\n"
    t = target(tmp_path, hosts, "gpu")
    assert t.jump is not None and t.jump.hostname == "10.1.0.1"  # bastion, from ssh_config
    assert t.jump.jump is not None and (t.jump.jump.hostname, t.jump.jump.user) == ("10.5.0.1", "ops")


def test_cli_user_and_key_are_for_the_host_not_its_bastion(tmp_path: Path) -> None:
    t = target(tmp_path, "behind:\n", "behind", ConnectOptions(user="clio", private_key="/keys/cli"))
    assert t.user == "clio" and t.key_files == ("/keys/cli",)
    assert t.jump is not None and t.jump.user == "jump" and t.jump.key_files == ()


def test_a_proxy_jump_loop_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="bastion chain longer than 8 hops"):
        target(tmp_path, "loop-a:\n", "loop-a")


def test_proxy_command_from_ssh_config_is_expanded(tmp_path: Path) -> None:
    t = target(tmp_path, "piped:\n", "piped")
    assert t.proxy_command == "nc -X connect piped 22" and t.jump is None


def test_password_and_passphrase_are_carried_but_never_shown(tmp_path: Path) -> None:
    t = target(tmp_path, "gpu1:\n  ansible_password: s3cret-pw\n  ansible_ssh_private_key_passphrase: s3cret-pp\n",
               "gpu1")
    assert (t.password, t.passphrase) == ("s3cret-pw", "s3cret-pp")
    assert "s3cret" not in repr(t)


@pytest.mark.parametrize(("host_vars", "cli", "keyword", "expected"), [
    ("", ConnectOptions(), None, None),
    ("", ConnectOptions(become=True), None, Become("root")),
    ("", ConnectOptions(become=True, become_user="svc"), None, Become("svc")),
    ("", ConnectOptions(become=True), False, None),  # a play's `become: false` beats -b
    ("ansible_become: false\n", ConnectOptions(become=True), True, None),  # the inventory beats both
    ("ansible_become: yes\nansible_become_user: sglang\n", ConnectOptions(), None, Become("sglang")),
    ("ansible_become: true\nansible_become_password: pw1\n", ConnectOptions(become_password="pw2"), None,
     Become("root", "pw1")),
    ("ansible_become: true\n", ConnectOptions(become_password="pw2"), None, Become("root", "pw2")),
])
def test_become_precedence(tmp_path: Path, host_vars: str, cli: ConnectOptions, keyword: bool | None,
                           expected: Become | None) -> None:
    inv = inventory(tmp_path, "gpu1:\n" + textwrap.indent(host_vars, "  "))
    assert resolve_become(inv.hosts["gpu1"].connection, cli, keyword) == expected


def test_include_is_expanded_relative_to_the_ssh_folder_and_keeps_its_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (home / ".ssh" / "config").write_text(
        "Host gpu*\n  Include conf.d/*.conf\n  User fleetop\nHost other\n  Port 2200\n")
    (home / ".ssh" / "conf.d" / "a.conf").write_text("IdentityFile ~/.ssh/a_key\n")
    (home / ".ssh" / "conf.d" / "b.conf").write_text("Host gpu7\n  HostName 10.0.0.7\n")
    system = tmp_path / "system_config"
    system.write_text("Host *\n  Port 2201\n")
    loaded = ssh_config.load(home / ".ssh" / "config", system)
    gpu7 = ssh_config.lookup("gpu7", loaded)
    # b.conf's Host gpu7 block holds HostName; `User fleetop` after the Include is still gpu*'s.
    assert (gpu7.hostname, gpu7.user, gpu7.port) == ("10.0.0.7", "fleetop", 2201)
    assert gpu7.identity_files == (str(home / ".ssh" / "a_key"),)
    other = ssh_config.lookup("other", loaded)
    assert (other.user, other.port, other.identity_files) == (None, 2200, ())  # the user's file first


def test_an_unreadable_or_broken_ssh_config_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "config"
    bad.write_text("Host a\n  Include /nonexistent/*.conf\n  Port notaport\n")
    loaded = ssh_config.load(bad, tmp_path / "none")
    with pytest.raises(InputError, match=rf"^{bad}: host 'a': Port 'notaport' is not 1-65535$"):
        ssh_config.lookup("a", loaded)


STOCK = """\
# Debian's /etc/ssh/ssh_config, as shipped
Host *
    SendEnv LANG LC_*
    HashKnownHosts yes
    GSSAPIAuthentication yes
"""


def test_a_config_setting_nothing_fleetctl_reads_gives_what_paramiko_would(tmp_path: Path) -> None:
    import paramiko

    stock = ssh_config.parse(STOCK, "stock")  # read without paramiko: a shorter start for every command
    by_paramiko = ssh_config.LoadedConfig(paramiko.SSHConfig.from_text(STOCK), "stock")
    for name in ("gpu7", "10.0.0.7"):
        assert ssh_config.lookup(name, stock) == ssh_config.lookup(name, by_paramiko)
    # One keyword fleetctl reads, in any case or spelling, and the whole file counts as ssh reads it.
    assert ssh_config.lookup("gpu7", ssh_config.parse(STOCK + "    port=2200\n", "stock")).port == 2200
    matched = ssh_config.parse("Match host gpu*\n  User fleetop\n" + STOCK, "stock")
    assert ssh_config.lookup("gpu7", matched).user == "fleetop"
