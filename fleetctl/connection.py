"""How to reach a host: connection settings read from its merged vars, checked at load time.

Ansible's connection variables (``ansible_host``, ``ansible_port``, ``ansible_user``,
``ansible_ssh_private_key_file``, ``ansible_python_interpreter``, ``ansible_connection``,
``ansible_timeout``, a bastion in ``ansible_ssh_common_args``) plus fleetctl's ``jump_host``,
``fleetctl_known_hosts`` and ``venv``.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fleetctl.errors import InventoryError

_CONNECTIONS: dict[str, Literal["ssh", "local"]] = {
    "ssh": "ssh", "smart": "ssh", "paramiko": "ssh", "paramiko_ssh": "ssh", "local": "local"
}


@dataclass(frozen=True)
class ConnectionSpec:
    """How to reach a host, read from its merged vars and checked when the inventory loads."""

    kind: Literal["ssh", "local"]
    hostname: str
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    python: str | None = None
    jump: str | None = None  # [user@]host[:port]
    known_hosts: str | None = None
    connect_timeout: float = 10.0
    venv: str | None = None


def describe_type(value: Any) -> str:
    names = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
    return names.get(type(value), type(value).__name__)


class _BadVar(ValueError):
    """A host var that cannot be used; connection_spec() adds the file and host."""


def connection_spec(path: Path, host: str, v: Mapping[str, Any]) -> ConnectionSpec:
    """The host's connection settings from its merged vars; a bad value names file and host."""
    try:
        return _parse_connection(path.parent.absolute(), host, v)
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
    return ConnectionSpec(
        kind=_CONNECTIONS[kind_name],
        hostname=hostname,
        port=_port(v, "ansible_port" if "ansible_port" in v else "ansible_ssh_port", 22),
        user=_text(v, "ansible_user") or _text(v, "ansible_ssh_user"),
        key_file=_path(v, "ansible_ssh_private_key_file", base) or _path(v, "ansible_private_key_file", base),
        python=_text(v, "ansible_python_interpreter"),
        jump=_jump(v),
        known_hosts=_path(v, "fleetctl_known_hosts", base),
        connect_timeout=_timeout(v),
        venv=_text(v, "venv"),
    )


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


def _jump(v: Mapping[str, Any]) -> str | None:
    """The jump host: var jump_host, else -J / ProxyJump / ProxyCommand in the ssh args."""
    if v.get("jump_host") is not None:
        return _check_jump(_text(v, "jump_host") or "", "jump_host")
    for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        args = _text(v, var)
        found = _jump_in_args(args, var) if args else None
        if found:
            return _check_jump(found, var)
    return None


def _jump_in_args(args: str, var: str) -> str | None:
    try:
        tokens = shlex.split(args)
    except ValueError as exc:
        raise _BadVar(f"{var} cannot be split like a shell line: {exc}") from None
    for i, token in enumerate(tokens):
        if token.startswith("-J"):
            return token[2:] or _next(tokens, i, var)
        if not token.startswith("-o"):
            continue
        option = token[2:] or _next(tokens, i, var)
        key, sep, value = option.partition("=")
        if not sep:
            key, _, value = option.partition(" ")
        if key.strip().lower() == "proxyjump":
            value = value.strip() or _next(tokens, i + (0 if token[2:] else 1), var)
            return None if value.lower() == "none" else value
        if key.strip().lower() == "proxycommand":  # ignoring it would skip the bastion silently
            raise _BadVar(f"{var}: ProxyCommand is not supported; use jump_host or -o ProxyJump=HOST")
    return None


def _next(tokens: Sequence[str], i: int, var: str) -> str:
    if i + 1 >= len(tokens):
        raise _BadVar(f"{var}: '{tokens[i]}' needs a value")
    return tokens[i + 1]


def _check_jump(jump: str, var: str) -> str:
    user, _, rest = jump.rpartition("@")
    host, _, port = rest.partition(":")
    what = f"jump host '{jump}'" + ("" if var == "jump_host" else f" (from {var})")
    if "," in jump:
        raise _BadVar(f"{what}: chained jump hosts are not supported (use one [user@]host[:port])")
    if not host or (not user and "@" in jump) or " " in jump or (port and not port.isdigit()):
        raise _BadVar(f"{what} must look like [user@]host[:port]")
    if port and not 1 <= int(port) <= 65535:
        raise _BadVar(f"{what} has a bad port (expected 1-65535)")
    return jump
