"""Multi-node servers (pure): the hosts sharing a value of the spec's ``service.node_group`` variable
are one server's nodes. Each host's launch templates get ``nnodes`` (the group's size),
``node_rank`` (its place in inventory order) and ``dist_init_addr`` (the group's first host's
``service_host``, else ``ansible_host``, else its name, with ``dist_init_port``, default 20000), so
``--nnodes "{{ nnodes }}" --node-rank "{{ node_rank }}" --dist-init-addr "{{ dist_init_addr }}"``
is written once in the spec. Rollouts keep such a group in one batch (``--group-by VAR`` or a
play's ``serial_group_var``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def node_vars(hosts: Mapping[str, Mapping[str, Any]], var: str) -> dict[str, dict[str, Any]]:
    """Per host (inventory order, all of the inventory: a group's first host need not be selected)."""
    groups: dict[object, list[str]] = {}
    for name, hv in hosts.items():
        key = hv.get(var)
        if key not in (None, ""):
            groups.setdefault(key, []).append(name)
    out: dict[str, dict[str, Any]] = {}
    for members in groups.values():
        first_vars = hosts[members[0]]
        where = first_vars.get("service_host") or first_vars.get("ansible_host") or members[0]
        addr = f"{where}:{first_vars.get('dist_init_port', 20000)}"
        for rank, name in enumerate(members):
            out[name] = {"nnodes": len(members), "node_rank": rank, "dist_init_addr": addr}
    return out


def annotate(contexts: Mapping[str, Any], inventory_hosts: Mapping[str, Any], var: str | None) -> None:
    """Add the node vars to each selected host's variables (a host outside every group gets none)."""
    if not var:
        return
    found = node_vars({n: h.vars for n, h in inventory_hosts.items()}, var)
    for name, ctx in contexts.items():
        ctx.vars.update(found.get(name, {}))
