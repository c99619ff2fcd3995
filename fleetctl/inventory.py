"""Load an Ansible YAML inventory: groups, host ranges, group_vars/host_vars, merged vars.

The semantics follow ansible-core's yaml inventory plugin and VariableManager, checked against
real Ansible by tests/test_inventory_ansible.py. Stricter than Ansible where Ansible only warns:
unknown keys, malformed groups and bad ranges are errors naming file:line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from fleetctl.connection import ConnectionSpec, connection_spec, describe_type, unknown_ansible_var
from fleetctl.errors import InputError, InventoryError
from fleetctl.patterns import HostIndex, RangeError, expand_host_range, select_names, split_host_port
from fleetctl.yamlfile import check_expansion, no_duplicate_keys

SECTIONS = ("hosts", "vars", "children")
_VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")  # Ansible's order: a bare NAME (or NAME/) first


@dataclass(frozen=True)
class Host:
    """One host; `groups` holds every group it is in, ancestors included, without 'all'."""

    name: str
    groups: tuple[str, ...]
    vars: dict[str, Any]  # merged by merge_vars(); treat as read-only
    connection: ConnectionSpec

    def __hash__(self) -> int:
        return hash(self.name)

    def to_dict(self) -> dict[str, Any]:
        """For output: vars named in ``secret_vars`` are masked (``Host.vars`` keeps the values)."""
        from fleetctl.secrets import masked

        return {"name": self.name, "groups": list(self.groups), "vars": masked(self.vars)}


@dataclass(frozen=True)
class Group:
    """A group; `hosts` are its direct members in inventory order (children's hosts not included).

    `vars` are the group's own: inline vars, then its group_vars files over them.
    """

    name: str
    parents: tuple[str, ...]
    children: tuple[str, ...]
    hosts: tuple[str, ...]
    vars: dict[str, Any]
    depth: int = 0  # longest path from 'all'
    priority: int = 1  # ansible_group_priority


@dataclass(frozen=True)
class Inventory:
    """A loaded inventory: every host with merged vars, every group, and pattern selection."""

    path: Path
    hosts: dict[str, Host]  # in inventory order
    groups: dict[str, Group]  # always has 'all' and 'ungrouped'

    def select(self, pattern: str | None) -> list[Host]:
        """Hosts matching an Ansible host pattern, sorted by name; None or '' means all."""
        names = list(self.hosts) if not pattern else select_names(pattern, self._index)
        return sorted((self.hosts[n] for n in set(names)), key=lambda h: h.name)

    def group_names(self) -> list[str]:
        """Sorted group names, without 'all', and without 'ungrouped' when it is empty."""
        return sorted(g for g in self.groups if g != "all" and (g != "ungrouped" or self.groups[g].hosts))

    def group_hosts(self, name: str) -> list[str]:
        """The hosts of a group and of its descendants, in inventory order."""
        return list(self._index.group_hosts[name])

    @cached_property
    def _index(self) -> HostIndex:
        return HostIndex(list(self.hosts), {g: _hosts_below(self.groups, g) for g in self.groups})


def _hosts_below(groups: Mapping[str, Group], name: str) -> list[str]:
    # Ansible's order: the group's own hosts, then its children's, breadth first.
    order, seen, hosts = [name], {name}, dict[str, None]()
    for g in order:
        hosts.update(dict.fromkeys(groups[g].hosts))
        order.extend(c for c in groups[g].children if c not in seen)
        seen.update(groups[g].children)
    return list(hosts)


@dataclass(frozen=True)
class VarLayer:
    """One group's variables as found, before merging: the inputs of merge_vars()."""

    name: str
    depth: int
    priority: int
    inline: Mapping[str, Any]  # from the inventory file
    files: Mapping[str, Any]  # from group_vars/NAME*


def merge_vars(
    groups: Sequence[VarLayer],
    host_inline: Mapping[str, Any],
    host_files: Mapping[str, Any],
    extra_vars: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Merge one host's variables, lowest precedence first (ansible-core's default order):

    1. inline vars of group 'all' in the inventory file
    2. inline vars of the host's other groups, sorted by (depth, ansible_group_priority, name):
       a parent before its child, groups at the same depth by priority, then alphabetically
    3. group_vars/all
    4. group_vars/GROUP of the host's other groups, in the same order as 2.
    5. the host's inline vars in the inventory file
    6. host_vars/HOST
    7. extra_vars (-e)

    So every group_vars file beats every inline group var (even a parent's file over a child's
    inline var), as Ansible's VARIABLE_PRECEDENCE does. Like Ansible's default
    hash_behaviour=replace, a later layer replaces a top-level key whole: no deep merge.
    """
    ordered = sorted(groups, key=lambda g: (g.depth, g.priority, g.name))  # 'all' has depth 0
    layers = [g.inline for g in ordered] + [g.files for g in ordered]
    merged: dict[str, Any] = {}
    for layer in (*layers, host_inline, host_files, extra_vars or {}):
        merged.update(layer)
    return merged


def load_inventory(path: str | Path, extra_vars: Mapping[str, Any] | None = None) -> Inventory:
    """Load an Ansible YAML inventory file with group_vars/ and host_vars/ beside it."""
    inv_path = Path(path)
    for key in extra_vars or {}:
        why = unknown_ansible_var(str(key))
        if why:
            raise InventoryError(f"-e {key}: {why}")
    data, lines, top_line = _read_inventory(inv_path)
    parser = _Parser(inv_path, lines)
    parser.parse_top(data, top_line)
    parser.reconcile()
    return _build(inv_path, parser, extra_vars or {})


# --- YAML loading ------------------------------------------------------------------------

try:
    from yaml import CSafeLoader as _BaseLoader  # libyaml: the inventory is on the startup path
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]


class _VarsLoader(_BaseLoader):
    """Safe YAML plus Ansible's !unsafe tag; !vault is refused with a clear message."""


def _construct_unsafe(loader: _VarsLoader, node: yaml.Node) -> Any:
    return loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else None


def _construct_vault(loader: _VarsLoader, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(
        None, None, "ansible-vault values (!vault) are not supported", node.start_mark
    )


_VarsLoader.add_constructor("!unsafe", _construct_unsafe)
_VarsLoader.add_constructor("!vault", _construct_vault)


class _LineLoader(_VarsLoader):
    """Records the 1-based line of every mapping key, by id() of the mapping, for error messages."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
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


def _yaml_error(path: Path, exc: yaml.YAMLError) -> InventoryError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc)
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and mark is not None and context_mark.line != mark.line:
        problem = f"{problem} ({context} at line {context_mark.line + 1})"
    return InventoryError(f"{where}: YAML error: {' '.join(str(problem).split())}")


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise InventoryError(f"{path}: is a directory; expected a YAML {what}") from None
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise InventoryError(f"{path}:{line}: not UTF-8 text (byte {exc.object[exc.start]:#04x})") from None
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read {what}: {exc}") from None


def _read_inventory(path: Path) -> tuple[Any, _Lines, int]:
    loader = _LineLoader(_read_text(path, "inventory file"))
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    finally:
        loader.dispose()
    try:
        check_expansion(data, str(path))
    except InputError as exc:
        raise InventoryError(str(exc)) from None
    return data, _Lines(loader.key_lines), node.start_mark.line + 1 if node is not None else 1


def _load_vars_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(_read_text(path, "vars file"), Loader=_VarsLoader)  # noqa: S506 - safe loader
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    try:
        check_expansion(data, str(path))
    except InputError as exc:
        raise InventoryError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InventoryError(f"{path}: a vars file must be a mapping of variables, got {describe_type(data)}")
    return data


class _VarsDir:
    """group_vars/ or host_vars/: NAME, NAME.yml, NAME.yaml or NAME.json (first found), or a
    folder NAME/ whose files are merged in sorted order, recursively, as Ansible does."""

    def __init__(self, root: Path, kind: str) -> None:
        self.root = root
        self.kind = kind  # "group" or "host", for messages
        self.entries = set(os.listdir(root)) if root.is_dir() else set()

    def load(self, name: str) -> dict[str, Any]:
        for ext in _VARS_EXTENSIONS:
            if name + ext in self.entries:
                found = self.root / (name + ext)
                files = _dir_files(found) if found.is_dir() else [found]
                break
        else:
            return {}
        merged: dict[str, Any] = {}
        for file in files:
            values = _load_vars_file(file)
            for key in values:
                why = unknown_ansible_var(str(key))
                if why:
                    raise InventoryError(f"{file}:{_key_line(file, str(key))}: {self.kind} '{name}': {why}")
            merged.update(values)
        return merged


def _key_line(path: Path, key: str) -> int:
    """The line of a top-level key in a vars file (looked up only to name an error)."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.split(":", 1)[0].strip().strip("\"'") == key:
            return number
    return 1


def _dir_files(folder: Path) -> list[Path]:
    files: list[Path] = []
    for entry in sorted(os.listdir(folder)):
        if entry.startswith(".") or entry.endswith("~"):  # hidden files and editor backups
            continue
        full, ext = folder / entry, os.path.splitext(entry)[1]
        if full.is_dir() and not ext:
            files.extend(_dir_files(full))
        elif full.is_file() and ext in _VARS_EXTENSIONS:
            files.append(full)
    return files


# --- Parsing the inventory file ----------------------------------------------------------


class _G:
    """A group while the file is parsed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.parents: list[str] = []
        self.children: list[str] = []
        self.hosts: list[str] = []
        self.vars: dict[str, Any] = {}
        self.priority = 1


class _Parser:
    """Walks the YAML like Ansible's yaml plugin, in file order, but fails on what it only warns."""

    def __init__(self, path: Path, lines: _Lines) -> None:
        self.path = path
        self.lines = lines
        self.groups: dict[str, _G] = {"all": _G("all"), "ungrouped": _G("ungrouped")}
        self.hosts: dict[str, dict[str, Any]] = {}  # host -> inline vars, in inventory order

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
        self.groups.setdefault(name, _G(name))
        if parent is not None:
            self.link(parent, name, line)
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
                self.set_group_vars(self.groups[name], section)
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

    def set_group_vars(self, group: _G, values: dict[Any, Any]) -> None:
        self.check_ansible_vars(f"group '{group.name}'", values)
        for key, value in values.items():
            if key != "ansible_group_priority":
                group.vars[key] = value
                continue
            # Ansible consumes it: it orders groups and is not a variable.
            if isinstance(value, bool) or not str(value).lstrip("-").isdigit():
                raise self.error(
                    self.lines.of(values, key),
                    f"ansible_group_priority of group '{group.name}' must be an integer, got {value!r}",
                )
            group.priority = int(value)

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
                values = self.hosts.setdefault(host, {})
                if port is not None:
                    values["ansible_port"] = port
                values.update(host_vars or {})
                if host not in self.groups[group].hosts:
                    self.groups[group].hosts.append(host)

    def link(self, parent: str, child: str, line: int) -> None:
        if child == "all":
            raise self.error(line, f"group 'all' cannot be a child of '{parent}'")
        if parent == child or parent in self.below(child):
            raise self.error(line, f"group '{child}' under '{parent}' makes a loop ('{parent}' is inside it)")
        if child not in self.groups[parent].children:
            self.groups[parent].children.append(child)
            self.groups[child].parents.append(parent)

    def below(self, name: str) -> set[str]:
        found, todo = set(), [name]
        while todo:
            kids = [c for c in self.groups[todo.pop()].children if c not in found]
            found.update(kids)
            todo.extend(kids)
        return found

    def reconcile(self) -> None:
        """Ansible's reconcile_inventory: orphan groups join 'all'; lone hosts join 'ungrouped'."""
        for name in list(self.groups):
            if name != "all" and not self.groups[name].parents:
                self.link("all", name, 0)
        ungrouped = self.groups["ungrouped"]
        member = {h for g in self.groups.values() if g.name not in ("all", "ungrouped") for h in g.hosts}
        lone = [h for h in ungrouped.hosts + self.groups["all"].hosts if h not in member]
        ungrouped.hosts = list(dict.fromkeys(lone))


# --- Building the inventory: depths, files, merged vars, connections ---------------------


def _build(path: Path, parser: _Parser, extra_vars: Mapping[str, Any]) -> Inventory:
    raw = parser.groups
    depth: dict[str, int] = {}

    def depth_of(name: str) -> int:  # longest path from 'all', as Ansible's Group.depth
        if name not in depth:
            depth[name] = max((depth_of(p) + 1 for p in raw[name].parents), default=0)
        return depth[name]

    group_files = _VarsDir(path.parent / "group_vars", "group")
    layers = {
        g.name: VarLayer(g.name, depth_of(g.name), g.priority, g.vars, group_files.load(g.name))
        for g in raw.values()
    }
    groups = {
        g.name: Group(g.name, tuple(g.parents), tuple(g.children), tuple(g.hosts),
                      {**g.vars, **layers[g.name].files}, layers[g.name].depth, g.priority)
        for g in raw.values()
    }
    member_of: dict[str, set[str]] = {h: set() for h in parser.hosts}
    for g in raw.values():
        for h in g.hosts:
            member_of[h].add(g.name)
    ancestors = _ancestors(raw)
    host_files = _VarsDir(path.parent / "host_vars", "host")
    hosts: dict[str, Host] = {}
    for name, inline in parser.hosts.items():
        names = set().union(*(ancestors[g] | {g} for g in member_of[name])) | {"all"}
        merged = merge_vars([layers[g] for g in names], inline, host_files.load(name), extra_vars)
        connection = connection_spec(path, name, merged)
        hosts[name] = Host(name, tuple(sorted(names - {"all"})), merged, connection)
    return Inventory(path, hosts, groups)


def _ancestors(raw: Mapping[str, _G]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}

    def walk(name: str) -> set[str]:
        if name not in found:
            found[name] = set().union(*({p} | walk(p) for p in raw[name].parents))
        return found[name]

    for name in raw:
        walk(name)
    return found
