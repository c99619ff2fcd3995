"""From the read sources to the Inventory: depths, group_vars/host_vars, merged vars, connections.

The one place where variable precedence lives (merge_vars)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.connection import connection_spec
from fleetctl.inventory.model import Group, Host, Inventory
from fleetctl.inventory.raw import RawGroup, RawInventory
from fleetctl.inventory.vars_files import VarsDir
from fleetctl.vault import Vault


@dataclass(frozen=True)
class VarLayer:
    """One group's variables as found, before merging: the inputs of merge_vars()."""

    name: str
    depth: int
    priority: int
    inline: Mapping[str, Any]  # from the inventory sources
    files: Mapping[str, Any]  # from group_vars/NAME* beside the first inventory source
    later_files: tuple[Mapping[str, Any], ...] = ()  # group_vars/NAME* beside the 2nd, 3rd... source


def merge_vars(
    groups: Sequence[VarLayer],
    host_inline: Mapping[str, Any],
    host_files: Mapping[str, Any],
    extra_vars: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Merge one host's variables, lowest precedence first (ansible-core's default order):

    1. inline vars of group 'all' in the inventory sources
    2. inline vars of the host's other groups, sorted by (depth, ansible_group_priority, name):
       a parent before its child, groups at the same depth by priority, then alphabetically
    3. group_vars/all
    4. group_vars/GROUP of the host's other groups, in the same order as 2.
    5. the host's inline vars in the inventory sources
    6. host_vars/HOST
    7. extra_vars (-e)

    So every group_vars file beats every inline group var (even a parent's file over a child's
    inline var), as Ansible's VARIABLE_PRECEDENCE does. With several inventory sources, 3 and 4
    run source by source (all sources' group_vars/all first, as Ansible's vars plugins run over
    the sources for 'all', then again for the other groups). Like Ansible's default
    hash_behaviour=replace, a later layer replaces a top-level key whole: no deep merge.
    """
    ordered = sorted(groups, key=lambda g: (g.depth, g.priority, g.name))  # 'all' has depth 0
    rounds = max((len(g.later_files) for g in ordered), default=0) + 1

    def files(layer: VarLayer, source: int) -> Mapping[str, Any]:
        if source == 0:
            return layer.files
        return layer.later_files[source - 1] if source - 1 < len(layer.later_files) else {}

    first = [g for g in ordered if g.name == "all"]
    rest = [g for g in ordered if g.name != "all"]
    layers: list[Mapping[str, Any]] = [g.inline for g in ordered]
    layers += [files(g, s) for g in first for s in range(rounds)]
    layers += [files(g, s) for s in range(rounds) for g in rest]
    merged: dict[str, Any] = {}
    for layer in (*layers, host_inline, host_files, extra_vars or {}):
        merged.update(layer)
    return merged


def vars_roots(sources: Sequence[Path]) -> list[Path]:
    """Where group_vars/ and host_vars/ are looked up: beside each file source, inside each directory."""
    return [s if s.is_dir() else s.parent for s in sources]


def build(sources: Sequence[Path], roots: Sequence[Path], raw: RawInventory,
          extra_vars: Mapping[str, Any], vault: Vault | None = None) -> Inventory:
    depth: dict[str, int] = {}
    groups_raw = raw.groups

    def depth_of(name: str) -> int:  # longest path from 'all', as Ansible's Group.depth
        if name not in depth:
            depth[name] = max((depth_of(p) + 1 for p in groups_raw[name].parents), default=0)
        return depth[name]

    group_dirs = [VarsDir(root / "group_vars", "group", vault) for root in roots]
    layers: dict[str, VarLayer] = {}
    for g in groups_raw.values():
        found = [d.load(g.name) for d in group_dirs] or [{}]
        layers[g.name] = VarLayer(g.name, depth_of(g.name), g.priority, g.vars, found[0], tuple(found[1:]))
    groups = {
        g.name: Group(g.name, tuple(g.parents), tuple(g.children), tuple(g.hosts),
                      _group_vars(layers[g.name]), layers[g.name].depth, g.priority)
        for g in groups_raw.values()
    }
    member_of: dict[str, set[str]] = {h: set() for h in raw.hosts}
    for g in groups_raw.values():
        for h in g.hosts:
            member_of[h].add(g.name)
    ancestors = _ancestors(groups_raw)
    host_dirs = [VarsDir(root / "host_vars", "host", vault) for root in roots]
    first = sources[0] if sources else Path("inventory")
    base = roots[0] if roots else Path.cwd()  # relative key files: the first source's folder
    hosts: dict[str, Host] = {}
    for name, inline in raw.hosts.items():
        names = set().union(*(ancestors[g] | {g} for g in member_of[name])) | {"all"}
        host_files: dict[str, Any] = {}
        for d in host_dirs:
            host_files.update(d.load(name))
        merged = merge_vars([layers[g] for g in names], inline, host_files, extra_vars)
        hosts[name] = Host(name, tuple(sorted(names - {"all"})), merged, connection_spec(first, name, merged, base))
    return Inventory(first, hosts, groups, tuple(sources))


def _group_vars(layer: VarLayer) -> dict[str, Any]:
    merged = {**layer.inline, **layer.files}
    for more in layer.later_files:
        merged.update(more)
    return merged


def _ancestors(raw: Mapping[str, RawGroup]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}

    def walk(name: str) -> set[str]:
        if name not in found:
            found[name] = set().union(*({p} | walk(p) for p in raw[name].parents))
        return found[name]

    for name in raw:
        walk(name)
    return found
