"""How to reach a host: connection settings read from its merged vars, checked at load time.

Ansible's connection variables (``ansible_host``, ``ansible_port``, ``ansible_user``,
``ansible_ssh_private_key_file``, ``ansible_password``, ``ansible_python_interpreter``,
``ansible_connection``, ``ansible_timeout``, a bastion and keepalives in ``ansible_ssh_common_args``
(its other options are reported when connecting: ``ssh_options.py``), the
``ansible_become*`` variables) plus fleetctl's ``jump_host``, ``fleetctl_known_hosts`` and
``venv``. What is not set here stays ``None``: ssh_config and the CLI fill it in later
(``transport/target.py``). Any other ``ansible_*`` variable is refused (``unknown_ansible_var``),
so none is silently ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from fleetctl import ssh_options
from fleetctl.errors import InventoryError

T = TypeVar("T")

_CONNECTIONS: dict[str, Literal["ssh", "local"]] = {
    "ssh": "ssh", "smart": "ssh", "paramiko": "ssh", "paramiko_ssh": "ssh", "local": "local"
}


@dataclass(frozen=True)
class ConnectionSpec:
    """How to reach a host, read from its merged vars and checked when the inventory loads."""

    kind: Literal["ssh", "local"]
    hostname: str
    port: int | None = None  # None: ssh_config's, else 22
    user: str | None = None  # None: ssh_config's, else -u, else the local user
    key_file: str | None = None
    python: str | None = None
    jump: str | None = None  # [user@]host[:port], comma-separated for a chain
    known_hosts: str | None = None
    connect_timeout: float = 10.0
    venv: str | None = None
    proxy_command: str | None = None
    password: str | None = field(default=None, repr=False)  # a secret, like the two below
    key_passphrase: str | None = field(default=None, repr=False)
    become: bool | None = None  # None: not set in the inventory (the CLI or the play decides)
    become_user: str | None = None
    become_password: str | None = field(default=None, repr=False)
    alive_interval: float | None = None  # ServerAliveInterval from the ssh args (None: ssh_config's or the default)
    alive_count_max: int | None = None
    ignored_ssh_args: tuple[tuple[str, str], ...] = ()  # (option as written, var): reported when connecting


# Every ansible_* variable fleetctl reads; any other one is an input error, never ignored.
ANSIBLE_VARS = frozenset({
    "ansible_connection", "ansible_host", "ansible_ssh_host", "ansible_port", "ansible_ssh_port",
    "ansible_user", "ansible_ssh_user", "ansible_ssh_private_key_file", "ansible_private_key_file",
    "ansible_python_interpreter", "ansible_timeout", "ansible_ssh_timeout", "ansible_ssh_common_args",
    "ansible_ssh_extra_args", "ansible_password", "ansible_ssh_pass", "ansible_ssh_password",
    "ansible_ssh_private_key_passphrase", "ansible_become", "ansible_become_user", "ansible_become_method",
    "ansible_become_password", "ansible_become_pass", "ansible_group_priority",
    "ansible_host_key_checking", "ansible_ssh_host_key_checking", "ansible_ssh_pipelining", "ansible_pipelining",
})


def unknown_ansible_var(name: str) -> str | None:
    """Why an ``ansible_*`` variable cannot be used, or None when fleetctl reads it (or it is not one)."""
    if not name.startswith("ansible_") or name in ANSIBLE_VARS:
        return None
    return (f"{name} is not a connection variable fleetctl implements (see the host variables reference); "
            "remove or rename it")


def describe_type(value: Any) -> str:
    names = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
    return names.get(type(value), type(value).__name__)


class _BadVar(ValueError):
    """A host var that cannot be used; connection_spec() adds the file and host."""


def connection_spec(path: Path, host: str, v: Mapping[str, Any], base: Path | None = None) -> ConnectionSpec:
    """The host's connection settings from its merged vars; a bad value names file and host.
    Relative paths (key files) resolve against ``base``, by default the inventory file's folder."""
    try:
        return _parse_connection((base or path.parent).absolute(), host, v)
    except _BadVar as exc:
        raise InventoryError(f"{path}: host '{host}': {exc}") from None


def _parse_connection(base: Path, host: str, v: Mapping[str, Any]) -> ConnectionSpec:
    kind_name = (_text(v, "ansible_connection") or "ssh").removeprefix("ansible.builtin.")
    if kind_name not in _CONNECTIONS:
        raise _BadVar(f"ansible_connection '{kind_name}' is not supported (expected ssh or local)")
    hostname = _text(v, "ansible_host") or _text(v, "ansible_ssh_host") or host
    if not hostname.strip() or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in hostname):
        raise _BadVar(f"ansible_host {hostname!r} is not a host name or address")
    secrets = v.get("secret_vars")
    if secrets is not None and not (isinstance(secrets, list) and all(isinstance(n, str) for n in secrets)):
        raise _BadVar(f"secret_vars must be a list of variable names, got {describe_type(secrets)}")
    for name in ("ansible_host_key_checking", "ansible_ssh_host_key_checking"):
        if name in v and _flag(v, name) is not True:
            raise _BadVar(f"{name}: fleetctl always checks host keys; pin them with `fleetctl hosts trust`")
    method = _text(v, "ansible_become_method") or "sudo"
    if method != "sudo":
        raise _BadVar(f"ansible_become_method '{method}' is not supported (fleetctl becomes with sudo)")
    port_var = "ansible_port" if "ansible_port" in v else "ansible_ssh_port"
    ssh = _ssh_vars(v)
    return ConnectionSpec(
        kind=_CONNECTIONS[kind_name],
        hostname=hostname,
        port=_port(v, port_var, 22) if port_var in v else None,
        user=_text(v, "ansible_user") or _text(v, "ansible_ssh_user"),
        key_file=_path(v, "ansible_ssh_private_key_file", base) or _path(v, "ansible_private_key_file", base),
        python=_text(v, "ansible_python_interpreter"),
        jump=ssh.jump,
        known_hosts=_path(v, "fleetctl_known_hosts", base),
        connect_timeout=_timeout(v),
        venv=_text(v, "venv"),
        proxy_command=ssh.proxy_command,
        alive_interval=ssh.alive_interval,
        alive_count_max=ssh.alive_count_max,
        ignored_ssh_args=ssh.ignored,
        password=_first(v, "ansible_password", "ansible_ssh_pass", "ansible_ssh_password"),
        key_passphrase=_text(v, "ansible_ssh_private_key_passphrase"),
        become=_flag(v, "ansible_become"),
        become_user=_text(v, "ansible_become_user"),
        become_password=_first(v, "ansible_become_password", "ansible_become_pass"),
    )


def _first(v: Mapping[str, Any], *names: str) -> str | None:
    for name in names:
        if v.get(name) is not None:
            return _text(v, name)
    return None


_TRUE = {"true", "yes", "on", "1", "y", "t"}
_FALSE = {"false", "no", "off", "0", "n", "f"}


def _flag(v: Mapping[str, Any], var: str) -> bool | None:
    """A boolean var as Ansible reads one (true/yes/on/1, false/no/off/0), None when unset."""
    value = v.get(var)
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise _BadVar(f"{var} must be a boolean (true or false), got {value!r}")


def _text(v: Mapping[str, Any], var: str) -> str | None:
    value = v.get(var)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _BadVar(f"{var} must be a string, got {describe_type(value)}")
    return str(value)


def _path(v: Mapping[str, Any], var: str, base: Path) -> str | None:
    text = _text(v, var)
    # Resolved against the inventory's folder (Ansible uses the working directory).
    return None if text is None else str(base / os.path.expanduser(text))


def _port(v: Mapping[str, Any], var: str, default: int) -> int:
    value = v.get(var, default)
    if isinstance(value, bool) or not str(value).isdigit() or not 1 <= int(value) <= 65535:
        raise _BadVar(f"{var} must be a port number 1-65535, got {value!r}")
    return int(value)


def _timeout(v: Mapping[str, Any]) -> float:
    var = "ansible_timeout" if "ansible_timeout" in v else "ansible_ssh_timeout"
    value = v.get(var, 10)
    try:
        seconds = float(value) if not isinstance(value, bool) else -1.0
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise _BadVar(f"{var} must be a number of seconds > 0, got {value!r}")
    return seconds


@dataclass(frozen=True)
class _SSHVars:
    jump: str | None = None
    proxy_command: str | None = None
    alive_interval: float | None = None
    alive_count_max: int | None = None
    ignored: tuple[tuple[str, str], ...] = ()


def _ssh_vars(v: Mapping[str, Any]) -> _SSHVars:
    """Var jump_host, else -J / ProxyJump / ProxyCommand in the ssh args; keepalives from the args
    (common args first: OpenSSH takes an option's first value); the options fleetctl leaves out."""
    found = _SSHVars()
    for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        text = _text(v, var)
        if not text:
            continue
        try:
            args = ssh_options.parse_ssh_args(text, var)
        except ValueError as exc:
            raise _BadVar(str(exc)) from None
        if not (found.jump or found.proxy_command) and (args.jump or args.proxy_command):
            found = replace(found, jump=args.jump and _check_jump(args.jump, var), proxy_command=args.proxy_command)
        found = replace(found, alive_interval=_first_set(found.alive_interval, args.alive_interval),
                        alive_count_max=_first_set(found.alive_count_max, args.alive_count_max),
                        ignored=found.ignored + tuple((option, var) for option in args.ignored))
    if v.get("jump_host") is not None:
        found = replace(found, jump=_check_jump(_text(v, "jump_host") or "", "jump_host"), proxy_command=None)
    return found


def _first_set(first: T | None, second: T | None) -> T | None:
    return first if first is not None else second


def check_jump(jump: str, where: str) -> str:
    """``[user@]host[:port]``, or several of them comma-separated (a chain, first hop first)."""
    for hop in jump.split(","):
        user, _, rest = hop.rpartition("@")
        host, _, port = rest.partition(":")
        what = f"jump host '{hop}'" + (f" (from {where})" if where else "")
        if not host or (not user and "@" in hop) or " " in hop or (port and not port.isdigit()):
            raise ValueError(f"{what} must look like [user@]host[:port]")
        if port and not 1 <= int(port) <= 65535:
            raise ValueError(f"{what} has a bad port (expected 1-65535)")
    return jump


def _check_jump(jump: str, var: str) -> str:
    try:
        return check_jump(jump, "" if var == "jump_host" else var)
    except ValueError as exc:
        raise _BadVar(str(exc)) from None
