"""The OpenSSH spelling of a connection fleetctl resolved (transport/openssh.py): what the bulk
stream of an overlay runs. Every hop strict against fleetctl's known_hosts, nothing read from the
user's own ssh files, and no connection OpenSSH could not make unattended."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from fleetctl.errors import ConnectError
from fleetctl.transport.openssh import OpenSSHStream, ssh_argv
from fleetctl.transport.target import Become, SSHTarget

KNOWN = Path("/etc/fleetctl/known_hosts")


def target(**kw: object) -> SSHTarget:
    fields: dict[str, object] = {"hostname": "10.0.0.5", "port": 2222, "user": "fleetop", "known_hosts": KNOWN,
                                 "connect_timeout": 7.5}
    fields.update(kw)
    return SSHTarget(**fields)  # type: ignore[arg-type]


def options(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-o")


def test_host_keys_are_checked_against_fleetctls_file_only() -> None:
    argv = ssh_argv(target(key_files=("/k/id_ed25519",)), "python3 -c pass")
    assert argv is not None
    assert argv[:3] == ["ssh", "-F", "/dev/null"]  # never ~/.ssh/config: the target is resolved already
    opts = options(argv)
    assert opts["StrictHostKeyChecking"] == "yes" and opts["BatchMode"] == "yes"
    assert opts["UserKnownHostsFile"] == str(KNOWN) and opts["GlobalKnownHostsFile"] == "/dev/null"
    assert opts["ConnectTimeout"] == "8"
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "fleetop"
    assert argv[argv.index("-i") + 1] == "/k/id_ed25519"
    assert argv[-3:] == ["--", "10.0.0.5", "python3 -c pass"]


def test_a_jump_host_is_its_own_checked_hop() -> None:
    hop = target(hostname="bastion.example", port=22, user="jump", key_files=("/k/jump%key",))
    argv = ssh_argv(target(jump=hop), "true")
    assert argv is not None
    proxy = options(argv)["ProxyCommand"]
    inner = shlex.split(proxy)
    # -W before the host: after it, it would be a command for the bastion's shell
    assert inner[-4:] == ["-W", "%h:%p", "--", "bastion.example"]
    assert "StrictHostKeyChecking=yes" in inner and f"UserKnownHostsFile={KNOWN}" in inner
    assert inner[inner.index("-i") + 1] == "/k/jump%%key"  # OpenSSH expands %-tokens once: kept literal


def test_what_openssh_cannot_do_unattended_is_left_to_paramiko() -> None:
    assert ssh_argv(target(password="s3cret"), "true") is None
    assert ssh_argv(target(passphrase="s3cret"), "true") is None
    assert ssh_argv(target(jump=target(password="s3cret")), "true") is None


def test_become_wraps_the_command_in_sudo_and_agent_choice_is_kept() -> None:
    argv = ssh_argv(target(become=Become(user="root"), allow_agent=False, look_for_keys=False), "python3 -")
    assert argv is not None
    assert argv[-1].startswith("sudo -H -n -u root -- /bin/sh -c")
    assert options(argv)["IdentityAgent"] == "none" and options(argv)["IdentitiesOnly"] == "yes"


def test_an_ssh_that_ended_is_one_line_naming_the_host_and_what_ssh_said() -> None:
    # A stand-in for ssh refusing the host (a real child process; the lab tests run real ssh).
    stream = OpenSSHStream(["/bin/sh", "-c", "echo 'Host key verification failed.' >&2; exit 255"], "gpu-b")
    try:
        with pytest.raises(ConnectError) as err:
            stream.send(b"x" * (4 << 20))  # more than the pipe holds: the write meets the closed end
        assert err.value.host == "gpu-b"
        assert err.value.reason == "ssh ended (exit 255): Host key verification failed."
        assert stream.connection_lost()
    finally:
        stream.close()
