"""Multi-node servers (pure): the hosts sharing a value of the spec's ``service.node_group`` variable
are one server's nodes. Each host's launch templates get ``nnodes`` (the group's size),
``node_rank`` (its place in inventory order) and ``dist_init_addr`` (the group's first host's
``service_host``, else ``ansible_host``, else its name, with ``dist_init_port``, default 20000), so
``--nnodes "{{ nnodes }}" --node-rank "{{ node_rank }}" --dist-init-addr "{{ dist_init_addr }}"``
is written once in the spec. Rollouts keep such a group in one batch (``--group-by VAR`` or a
play's ``serial_group_var``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.release.spec import Health


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


# What a node of rank > 0 serves: SGLang starts no API server there, only a health server (sglang
# 0.5.23 srt/entrypoints/engine.py, node_rank >= 1: launch_dummy_health_check_server, whose
# /ping, /health and /health_generate answer 200; /metrics with --enable-metrics).
RANK_N_PATHS = ("/health", "/health_generate", "/ping")


def rank_of(host_vars: Mapping[str, Any]) -> int:
    """The host's rank in its multi-node server (0 for rank 0 and for a single-node server)."""
    try:
        return int(host_vars.get("node_rank") or 0) if int(host_vars.get("nnodes") or 1) > 1 else 0
    except (TypeError, ValueError):
        return 0


def serving_health(health: Health, host_vars: Mapping[str, Any]) -> Health:
    """The gates a node can pass for what it serves: rank 0 the spec's, whole; a rank > 0 its health
    endpoint and the probes of its installed release (no warm-up, thresholds or canary: there is no
    /generate or /server_info to ask; rank 0 answers for the group)."""
    if not rank_of(host_vars):
        return health
    path = health.path if health.path in RANK_N_PATHS else "/health"
    return health.model_copy(update={"path": path, "warmup": None, "thresholds": [], "canary": None})
