"""The loaded inventory: hosts with merged vars, groups, and host-pattern selection."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from fleetctl.connection import ConnectionSpec
from fleetctl.errors import PatternError
from fleetctl.patterns import HostIndex, select_names, split_pattern


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
        """For output: vars named in ``secret_vars`` (and vault values) are masked (``Host.vars`` keeps them)."""
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

    path: Path  # the first source (a file or a directory)
    hosts: dict[str, Host]  # in inventory order
    groups: dict[str, Group]  # always has 'all' and 'ungrouped'
    sources: tuple[Path, ...] = field(default=())  # every -i source, in order

    @property
    def folder(self) -> Path:
        """The first source's folder (the source itself when it is a directory): where fleetctl keeps
        known_hosts and run journals beside the inventory."""
        return self.path if self.path.is_dir() else self.path.parent

    def select(self, pattern: str | None) -> list[Host]:
        """Hosts matching an Ansible host pattern, sorted by name; None or '' means all.

        A part ``@FILE`` stands for the patterns in FILE, one a line (Ansible's ``--limit @file``)."""
        if pattern and "@" in pattern:
            pattern = _expand_limit_files(pattern)
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


def _expand_limit_files(pattern: str) -> str:
    parts: list[str] = []
    for part in split_pattern(pattern):
        if not part.startswith("@"):
            parts.append(part)
            continue
        path = Path(part[1:])
        if not path.is_file():
            what = "is a directory, not a file" if path.is_dir() else "not found"
            raise PatternError(f"limit file {path}: {what}")
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise PatternError(f"limit file {path}: cannot read: {exc}") from None
        parts.extend(line.strip() for line in lines if line.strip())
    if not parts:
        raise PatternError(f"no hosts match '{pattern}' (the limit files are empty)")
    return ",".join(parts)


def _hosts_below(groups: Mapping[str, Group], name: str) -> list[str]:
    # Ansible's order: the group's own hosts, then its children's, breadth first.
    order, seen, hosts = [name], {name}, dict[str, None]()
    for g in order:
        hosts.update(dict.fromkeys(groups[g].hosts))
        order.extend(c for c in groups[g].children if c not in seen)
        seen.update(groups[g].children)
    return list(hosts)
