"""The inventory while its sources are read: every source (YAML, INI, script, host list) adds
groups, hosts and inline vars here, in order, as Ansible's InventoryData; build.py merges."""

from __future__ import annotations

from typing import Any


class Refused(ValueError):
    """An inventory entry that cannot be used; the source adds its file:line."""


class RawGroup:
    """A group while the sources are read."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.parents: list[str] = []
        self.children: list[str] = []
        self.hosts: list[str] = []
        self.vars: dict[str, Any] = {}
        self.priority = 1


class RawInventory:
    def __init__(self) -> None:
        self.groups: dict[str, RawGroup] = {"all": RawGroup("all"), "ungrouped": RawGroup("ungrouped")}
        self.hosts: dict[str, dict[str, Any]] = {}  # host -> inline vars, in inventory order

    def add_group(self, name: str) -> RawGroup:
        return self.groups.setdefault(name, RawGroup(name))

    def add_host(self, group: str, host: str, port: int | None = None) -> dict[str, Any]:
        """The host joins the group (once); a port sets its ansible_port. Returns its inline vars."""
        values = self.hosts.setdefault(host, {})
        if port is not None:
            values["ansible_port"] = port
        if host not in self.add_group(group).hosts:
            self.groups[group].hosts.append(host)
        return values

    def set_group_var(self, group: str, key: str, value: Any) -> None:
        grp = self.add_group(group)
        if key != "ansible_group_priority":
            grp.vars[key] = value
            return
        # Ansible consumes it: it orders groups and is not a variable.
        if isinstance(value, bool) or not str(value).lstrip("-").isdigit():
            raise Refused(f"ansible_group_priority of group '{group}' must be an integer, got {value!r}")
        grp.priority = int(value)

    def link(self, parent: str, child: str) -> None:
        if child == "all":
            raise Refused(f"group 'all' cannot be a child of '{parent}'")
        self.add_group(parent)
        self.add_group(child)
        if parent == child or parent in self.below(child):
            raise Refused(f"group '{child}' under '{parent}' makes a loop ('{parent}' is inside it)")
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
                self.link("all", name)
        ungrouped = self.groups["ungrouped"]
        member = {h for g in self.groups.values() if g.name not in ("all", "ungrouped") for h in g.hosts}
        lone = [h for h in ungrouped.hosts + self.groups["all"].hosts if h not in member]
        ungrouped.hosts = list(dict.fromkeys(lone))

