"""SSH keepalives and the ssh options fleetctl does not honour (issue 31, item 8), without a host:
where ServerAliveInterval/ServerAliveCountMax come from, what the ssh processes are given, and the
one line per run for each option fleetctl leaves out."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetctl import ssh_options
from fleetctl.errors import InputError, InventoryError
from fleetctl.inventory import Inventory, load_inventory
from fleetctl.overlay import stream as overlay_stream
from fleetctl.transport import ssh_config
from fleetctl.transport.openssh import ssh_argv
from fleetctl.transport.target import ConnectOptions, SSHTarget, resolve_target

CONFIG = """\
Host gpu*
  ServerAliveInterval 1m
  ServerAliveCountMax 5
  ForwardAgent yes
Host *
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
"""


@pytest.fixture(autouse=True)
def _fresh_run() -> Iterator[None]:
    ssh_options.forget_reports()
    yield
    ssh_options.forget_reports()


def inventory(tmp_path: Path, hosts: str) -> Inventory:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n" + textwrap.indent(textwrap.dedent(hosts), "    "))
    return load_inventory(path)


def targets(tmp_path: Path, hosts: str, config: str = CONFIG, sources: str = "test config") -> dict[str, SSHTarget]:
    inv = inventory(tmp_path, hosts)
    parsed = ssh_config.parse(config, sources)
    return {name: resolve_target(inv, h.connection, ConnectOptions(), config=parsed) for name, h in inv.hosts.items()}


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fleetctl.ssh" and r.levelno == logging.WARNING]


def test_keepalive_default_then_ssh_config_then_the_inventorys_ssh_args(tmp_path: Path) -> None:
    found = targets(tmp_path, """\
        plain:
        gpu1:
        gpu2:
          ansible_ssh_common_args: "-o ServerAliveInterval=30 -o ServerAliveCountMax=2"
          ansible_ssh_extra_args: "-o ServerAliveInterval=99"
        other:
          ansible_ssh_extra_args: "-oServerAliveInterval=1m30s"
        """, config="Host gpu*\n  ServerAliveInterval 1m\n  ServerAliveCountMax 5\n")
    got = {name: (t.alive_interval, t.alive_count_max) for name, t in found.items()}
    assert got == {"plain": (15.0, 3), "gpu1": (60.0, 5), "gpu2": (30.0, 2), "other": (90.0, 3)}
    off = targets(tmp_path, "h:\n  ansible_ssh_common_args: '-o ServerAliveInterval=0'\n")
    assert off["h"].alive_interval == 0  # OpenSSH's own way to turn them off


def test_a_bad_keepalive_value_is_one_line_naming_the_file_and_host(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"hosts\.yml: host 'h': ansible_ssh_common_args: "
                                             r"ServerAliveInterval 'soon' is not a time \(seconds, or like 1m30s\)$"):
        inventory(tmp_path, "h:\n  ansible_ssh_common_args: '-o ServerAliveInterval=soon'\n")
    config = tmp_path / "config"
    config.write_text("Host a\n  ServerAliveCountMax many\n")
    loaded = ssh_config.load(config, tmp_path / "none")
    with pytest.raises(InputError, match=rf"^{config}: host 'a': ServerAliveCountMax 'many' is not a whole number$"):
        ssh_config.lookup("a", loaded)


def test_every_ssh_process_gets_the_keepalives_every_hop_too() -> None:
    known = Path("/k/known_hosts")
    hop = SSHTarget("10.0.0.1", 22, "jump", known, 5.0, alive_interval=20.0, alive_count_max=4)
    argv = ssh_argv(SSHTarget("10.0.0.5", 22, "ops", known, 5.0, jump=hop, alive_interval=7.5), "true")
    assert argv is not None
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert "ServerAliveInterval=8" in opts and "ServerAliveCountMax=3" in opts  # whole seconds, rounded up
    proxy = next(o for o in opts if o.startswith("ProxyCommand="))
    assert "ServerAliveInterval=20" in proxy and "ServerAliveCountMax=4" in proxy

    from fleetctl.connection import ConnectionSpec

    source = SimpleNamespace(name="lab1", connector=None, host=SimpleNamespace(connection=ConnectionSpec(
        "ssh", "10.0.0.1", 22, "ops", alive_interval=45.0)))
    direct = overlay_stream.direct_argv(source, SimpleNamespace(name="lab2", vars={}), "true")  # type: ignore[arg-type]
    assert "ServerAliveInterval=45" in direct and "ServerAliveCountMax=3" in direct


def test_options_fleetctl_does_not_honour_are_reported_once_per_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fleetctl.ssh")
    args = "-C -o ForwardAgent=yes -o ServerAliveInterval=5 -i ~/.ssh/other -o StrictHostKeyChecking=no -J bast"
    hosts = "".join(f"gpu{i}:\n  ansible_ssh_common_args: '{args}'\n" for i in range(3))
    found = targets(tmp_path, hosts, sources="/home/u/.ssh/config")
    known = tmp_path / "known_hosts"
    assert found["gpu2"].jump is not None and found["gpu2"].alive_interval == 5.0  # honoured, not reported
    assert warnings(caplog) == [
        "ssh option '-C' (ansible_ssh_common_args, host gpu0) is not honoured by fleetctl; ignored",
        "ssh option '-o ForwardAgent=yes' (ansible_ssh_common_args, host gpu0) is not honoured by fleetctl; ignored",
        "ssh option '-i ~/.ssh/other' (ansible_ssh_common_args, host gpu0) is not honoured by fleetctl; ignored "
        "(set ansible_ssh_private_key_file)",
        f"fleetctl ignores '-o StrictHostKeyChecking=no' (ansible_ssh_common_args, host gpu0) and still checks "
        f"host keys, against {known} (pin new hosts with `fleetctl hosts trust`)",
        "ssh option 'ForwardAgent yes' (/home/u/.ssh/config, host gpu0) is not honoured by fleetctl; ignored",
        f"fleetctl ignores 'StrictHostKeyChecking no' (/home/u/.ssh/config, host gpu0) and still checks host keys, "
        f"against {known} (pin new hosts with `fleetctl hosts trust`)",
        f"fleetctl ignores 'UserKnownHostsFile /dev/null' (/home/u/.ssh/config, host gpu0) and still checks "
        f"host keys, against {known} (pin new hosts with `fleetctl hosts trust`)",
    ]
    caplog.clear()
    targets(tmp_path, hosts, sources="/home/u/.ssh/config")
    assert warnings(caplog) == []  # the same run: said once


def test_the_file_that_set_a_keyword_is_named_and_quiet_ones_are_not_reported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.WARNING, logger="fleetctl.ssh")
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (home / ".ssh" / "config").write_text("Host gpu*\n  Include conf.d/*.conf\n  StrictHostKeyChecking yes\n")
    (home / ".ssh" / "conf.d" / "tunnel.conf").write_text("LocalForward 8080 localhost:80\n")
    system = tmp_path / "ssh_config"
    system.write_text("Host *\n  SendEnv LANG LC_*\n  HashKnownHosts yes\n  GSSAPIAuthentication yes\n"
                      "  ControlMaster auto\n")
    loaded = ssh_config.load(home / ".ssh" / "config", system)
    inv = inventory(tmp_path, "gpu7:\nweb1:\n")
    for host in inv.hosts.values():
        resolve_target(inv, host.connection, ConnectOptions(), config=loaded)
    assert warnings(caplog) == [f"ssh option 'LocalForward 8080 localhost:80' ({home}/.ssh/conf.d/tunnel.conf, "
                                "host gpu7) is not honoured by fleetctl; ignored"]
    stock = ssh_config.parse(system.read_text(), str(system))
    assert stock.parsed is None  # Debian's stock file still costs no paramiko import (issue 23)
