"""An Ansible YAML inventory file, read like ansible-core's yaml plugin, in file order, but
failing (file:line) where Ansible only warns: unknown keys, malformed groups, bad ranges."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from fleetctl.connection import describe_type, unknown_ansible_var
from fleetctl.errors import InputError, InventoryError
from fleetctl.inventory.raw import RawInventory, Refused
from fleetctl.inventory.vars_files import VarsLoader, decrypt_file_text, read_text, yaml_error
from fleetctl.patterns import RangeError, expand_host_range, split_host_port
from fleetctl.vault import Vault, VaultStr
from fleetctl.yamlfile import check_expansion, no_duplicate_keys

SECTIONS = ("hosts", "vars", "children")


class _LineLoader(VarsLoader):
    """Records the 1-based line of every mapping key, by id() of the mapping, for error messages."""

    def __init__(self, stream: str, path: Path | None = None, vault: Vault | None = None) -> None:
        super().__init__(stream, path, vault)
        self.key_lines: dict[int, dict[Any, int]] = {}


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> Iterator[dict[Any, Any]]:
    data: dict[Any, Any] = {}
    yield data
    no_duplicate_keys(loader, node)
    data.update(loader.construct_mapping(node))
    loader.key_lines[id(data)] = {loader.construct_object(k): k.start_mark.line + 1 for k, _ in node.value}


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)


class _Lines:
    def __init__(self, key_lines: dict[int, dict[Any, int]]) -> None:
        self._key_lines = key_lines

    def of(self, mapping: Mapping[Any, Any], key: Any) -> int:
        return self._key_lines.get(id(mapping), {}).get(key, 0)


def read_yaml_inventory(path: Path, text: str | None = None, vault: Vault | None = None,
                        secret: bool = False) -> tuple[Any, _Lines, int]:
    """The parsed document, its key lines, and the line where it starts; ``secret``: ``text`` is
    what an encrypted file decrypted to."""
    text, encrypted = decrypt_file_text(path, read_text(path, "inventory file") if text is None else text, vault)
    loader = _LineLoader(text, path, vault)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise yaml_error(path, exc) from None
    finally:
        loader.dispose()
    try:
        check_expansion(data, str(path))
    except InputError as exc:
        raise InventoryError(str(exc)) from None
    if encrypted or secret:  # every string of an encrypted inventory is a secret (line numbers stay valid)
        _mark_in_place(data)
    return data, _Lines(loader.key_lines), node.start_mark.line + 1 if node is not None else 1


def _mark_in_place(data: Any) -> None:
    if isinstance(data, dict):
        for key, value in data.items():
            data[key] = VaultStr(value) if isinstance(value, str) else value
            _mark_in_place(value)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            data[i] = VaultStr(value) if isinstance(value, str) else value
            _mark_in_place(value)


def parse_yaml(path: Path, raw: RawInventory, text: str | None = None, vault: Vault | None = None,
               secret: bool = False) -> None:
    data, lines, top_line = read_yaml_inventory(path, text, vault, secret)
    _Parser(path, lines, raw).parse_top(data, top_line)


class _Parser:
    def __init__(self, path: Path, lines: _Lines, raw: RawInventory) -> None:
        self.path = path
        self.lines = lines
        self.raw = raw

    def error(self, line: int, message: str) -> InventoryError:
        return InventoryError(f"{self.path}:{line}: {message}" if line else f"{self.path}: {message}")

    def parse_top(self, data: Any, line: int) -> None:
        if data is None:
            raise self.error(0, "the inventory is empty (expected a mapping of groups such as 'all:')")
        if not isinstance(data, dict):
            raise self.error(line, f"the top level must map group names like 'all:', got {describe_type(data)}")
        if isinstance(data.get("plugin"), str):
            raise self.error(self.lines.of(data, "plugin"), "inventory plugins ('plugin:') are not supported")
        for name, body in data.items():
            self.group(name, body, self.lines.of(data, name), parent=None)

    def group(self, name: Any, body: Any, line: int, parent: str | None) -> None:
        if not isinstance(name, str) or not name:
            raise self.error(line, f"group name {name!r} must be a non-empty string (quote it)")
        self.raw.add_group(name)
        if parent is not None:
            try:
                self.raw.link(parent, name)
            except Refused as exc:
                raise self.error(line, str(exc)) from None
        if body is None:
            return
        if not isinstance(body, dict):
            expected = ", ".join(SECTIONS)
            raise self.error(line, f"group '{name}' must be a mapping ({expected}), got {describe_type(body)}")
        for key, value in body.items():  # file order, as Ansible: a later definition wins
            key_line = self.lines.of(body, key)
            if key not in SECTIONS:
                expected = ", ".join(SECTIONS)
                raise self.error(key_line, f"unknown key '{key}' in group '{name}' (expected {expected})")
            section = self.section(name, key, value, key_line)
            if key == "vars":
                self.set_group_vars(name, section)
            elif key == "hosts":
                self.add_hosts(name, section)
            else:
                for child, child_body in section.items():
                    self.group(child, child_body, self.lines.of(section, child), parent=name)

    def section(self, group: str, key: str, value: Any, line: int) -> dict[Any, Any]:
        if value is None:
            return {}
        if isinstance(value, str) and key != "vars":  # Ansible accepts 'hosts: ct129'
            return {value: None}
        if not isinstance(value, dict):
            hint = " (write one 'name:' per line)" if isinstance(value, list) and key != "vars" else ""
            raise self.error(line, f"'{key}' of group '{group}' must be a mapping, got {describe_type(value)}{hint}")
        return value

    def check_ansible_vars(self, owner: str, values: Mapping[Any, Any]) -> None:
        for key in values:
            why = unknown_ansible_var(str(key))
            if why:
                raise self.error(self.lines.of(values, key), f"{owner}: {why}")

    def set_group_vars(self, group: str, values: dict[Any, Any]) -> None:
        self.check_ansible_vars(f"group '{group}'", values)
        for key, value in values.items():
            try:
                self.raw.set_group_var(group, key, value)
            except Refused as exc:
                raise self.error(self.lines.of(values, key), str(exc)) from None

    def add_hosts(self, group: str, hosts: dict[Any, Any]) -> None:
        for key, host_vars in hosts.items():
            line = self.lines.of(hosts, key)
            if not isinstance(key, str):
                raise self.error(line, f"host name {key!r} in group '{group}' must be a string (quote it)")
            if host_vars is not None and not isinstance(host_vars, dict):
                raise self.error(line, f"host '{key}' in group '{group}' must map to vars or nothing, "
                                 f"got {describe_type(host_vars)}")
            if not key.strip() or any(ord(c) < 32 or ord(c) == 127 for c in key):
                raise self.error(line, f"host name {key!r} in group '{group}' is empty or holds control characters")
            self.check_ansible_vars(f"host '{key}'", host_vars or {})
            name, port = split_host_port(key)
            try:
                names = expand_host_range(name)
            except RangeError as exc:
                raise self.error(line, str(exc)) from None
            for host in names:
                self.raw.add_host(group, host, port).update(host_vars or {})
