"""An Ansible INI inventory, read as ansible-core's ini plugin reads it: ``[group]`` host lines with
inline ``key=value`` vars, ``[group:vars]``, ``[group:children]``, ranges, ``host:port``, and
Ansible's value typing (``ast.literal_eval``, else the text). Every refusal names file:line."""

from __future__ import annotations

import ast
import re
import shlex
import warnings
from pathlib import Path
from typing import Any

from fleetctl.connection import unknown_ansible_var
from fleetctl.errors import InventoryError
from fleetctl.inventory.raw import RawInventory, Refused
from fleetctl.patterns import RangeError, expand_host_range, split_host_port
from fleetctl.vault import mark_secret

_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_GROUP_NAME = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")


def ini_value(text: str) -> Any:
    """Ansible's INI typing: a Python literal (1, 1.5, True, None, [..], {..}) when it reads as one,
    else the text itself. Tuples and sets become lists, bytes and complex numbers strings."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return _coerce(value)


def _coerce(value: Any) -> Any:
    if isinstance(value, list | tuple | set):
        return [_coerce(v) for v in value]
    if isinstance(value, dict):
        return {_coerce(k): _coerce(v) for k, v in value.items()}
    if value is ...:
        return "..."
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    return value


class _Pending:
    def __init__(self, line: int, state: str, parents: list[str]) -> None:
        self.line, self.state, self.parents = line, state, parents


def parse_ini(path: Path, raw: RawInventory, text: str, secret: bool = False) -> None:
    """``secret``: ``text`` is what a vault-encrypted file decrypted to (every value is a secret)."""
    _IniParser(path, raw, secret).parse(text.splitlines())


class _IniParser:
    def __init__(self, path: Path, raw: RawInventory, secret: bool = False) -> None:
        self.path, self.raw = path, raw
        self.value = (lambda text: mark_secret(ini_value(text))) if secret else ini_value
        self.line = 0
        self.pending: dict[str, _Pending] = {}

    def error(self, message: str, line: int | None = None) -> InventoryError:
        return InventoryError(f"{self.path}:{self.line if line is None else line}: {message}")

    def parse(self, lines: list[str]) -> None:
        group, state = "ungrouped", "hosts"
        for self.line, text in enumerate(lines, 1):
            text = text.strip()
            if not text or text[0] in "#;":
                continue
            m = _SECTION.match(text)
            if m:
                group, state = m.group(1), m.group(2) or "hosts"
                self.section(group, state, text)
                continue
            if text.startswith("[") and text.endswith("]"):
                raise self.error(f"invalid section '{text}' (no spaces or other characters allowed in "
                                 "'[group]', '[group:vars]', '[group:children]')")
            try:
                if state == "hosts":
                    self.host_line(group, text)
                elif state == "vars":
                    self.var_line(group, text)
                else:
                    self.child_line(group, text)
            except Refused as exc:
                raise self.error(str(exc)) from None
        for name, decl in self.pending.items():
            if decl.state == "vars":
                raise self.error(f"section [{name}:vars] is for a group defined nowhere in the file", decl.line)
            raise self.error(f"section [{decl.parents[-1]}:children] names group '{name}', defined nowhere "
                             "in the file (give it a [section] of its own)", decl.line)

    def section(self, group: str, state: str, text: str) -> None:
        if state not in ("hosts", "children", "vars"):
            raise self.error(f"section {text} has unknown type '{state}' (expected vars or children)")
        if group not in self.raw.groups:
            if state == "vars" and group not in self.pending:
                self.pending[group] = _Pending(self.line, state, [])
            self.raw.add_group(group)
        decl = self.pending.get(group)
        if decl is not None and state != "vars":
            if decl.state == "children":
                self.resolve(group)
            else:
                del self.pending[group]

    def resolve(self, group: str) -> None:
        for parent in self.pending[group].parents:
            try:
                self.raw.link(parent, group)
            except Refused as exc:
                raise self.error(str(exc), self.pending[group].line) from None
            if parent in self.pending and self.pending[parent].state == "children":
                self.resolve(parent)
        self.pending.pop(group, None)

    def host_line(self, group: str, text: str) -> None:
        try:
            tokens = shlex.split(text, comments=True)
        except ValueError as exc:
            raise Refused(f"cannot split host line like a shell line: {exc}") from None
        if not tokens:
            return
        name, port = split_host_port(tokens[0])
        if tokens[0].strip().endswith(":") and port is None:
            raise Refused(f"host '{tokens[0]}' ends in ':' (reserved for a port)")
        if name.strip() == "---":
            raise Refused("host '---' is a sign this is a YAML file (name it .yml)")
        if any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise Refused(f"host name {name!r} holds control characters")
        values: dict[str, Any] = {}
        for token in tokens[1:]:
            key, eq, value = token.partition("=")
            if not eq:
                raise Refused(f"expected key=value host variable, got '{token}'")
            values[key] = self.value(value)
        self.check(f"host '{tokens[0]}'", values)
        try:
            names = expand_host_range(name)
        except RangeError as exc:
            raise Refused(str(exc)) from None
        for host in names:
            self.raw.add_host(group, host, port).update(values)

    def var_line(self, group: str, text: str) -> None:
        key, eq, value = text.partition("=")
        if not eq:
            raise Refused(f"expected key=value in [{group}:vars], got '{text}'")
        key = key.strip()
        self.check(f"group '{group}'", {key: None})
        self.raw.set_group_var(group, key, self.value(value.strip()))

    def child_line(self, group: str, text: str) -> None:
        m = _GROUP_NAME.match(text)
        if not m:
            raise Refused(f"expected a group name in [{group}:children], got '{text}'")
        child = m.group(1)
        if child not in self.raw.groups:
            decl = self.pending.setdefault(child, _Pending(self.line, "children", []))
            decl.parents.append(group)
        else:
            self.raw.link(group, child)

    def check(self, owner: str, values: dict[str, Any]) -> None:
        for key in values:
            why = unknown_ansible_var(key)
            if why:
                raise Refused(f"{owner}: {why}")
