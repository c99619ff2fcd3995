"""A release's server instances on each host (pure).

A spec without ``service.instances`` has one unnamed server: unit ``sglang``, ``service.json`` and
``service.env`` in the release folder, as before instances existed. A spec with instances has one
server per instance, in the spec's order: unit ``sglang@NAME``, ``service.NAME.json`` and
``service.NAME.env``; the release's ``service.json`` then lists the instance names, so a restart,
a rollback or ``status`` knows which servers the now-current release runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.release.spec import Health, ReleaseSpec


@dataclass(frozen=True)
class ServerInstance:
    name: str | None = None  # None: the single server of a spec without instances
    port: int | str = 30000
    gpus: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    health: Health | None = None

    @property
    def unit_name(self) -> str:
        return "sglang" if self.name is None else f"sglang@{self.name}"

    @property
    def params_name(self) -> str:
        return "service.json" if self.name is None else f"service.{self.name}.json"

    @property
    def env_name(self) -> str:
        return "service.env" if self.name is None else f"service.{self.name}.env"

    @property
    def label(self) -> str:
        return self.name or "sglang"


def of_spec(spec: ReleaseSpec) -> list[ServerInstance]:
    svc = spec.model.service
    if not svc.instances:
        return [ServerInstance(None, svc.port, svc.gpus)]
    return [ServerInstance(i.name, i.port, i.gpus, tuple(i.args), dict(i.env), i.health) for i in svc.instances]


def health_of(spec: ReleaseSpec, inst: ServerInstance, host_vars: Mapping[str, Any] | None = None) -> Health:
    """The gates of one server: the instance's own or the spec's; on a multi-node server's rank > 0
    node only those it can pass for what it serves (``nodegroups.serving_health``)."""
    from fleetctl.release.nodegroups import serving_health

    return serving_health(inst.health or spec.model.health, host_vars or {})


def names_of(stored: Mapping[str, Any] | None) -> list[str | None]:
    """The instances a release runs, from its ``service.json`` (``[None]``: the single server; ``[]``:
    no release)."""
    if not stored:
        return []
    listed = stored.get("instances")
    return [str(n) for n in listed] if isinstance(listed, list) and listed else [None]


def index(stored_names: list[str | None]) -> dict[str, str | None]:
    return {ServerInstance(n).label: n for n in stored_names}


def select(names: list[str | None], wanted: str | None, host: str) -> list[str | None]:
    """``wanted`` (an instance name, or None for all) among the instances a host's release runs."""
    if wanted is None:
        return names
    found = [n for n in names if ServerInstance(n).label == wanted]
    if not found:
        from fleetctl.errors import HostError

        have = ", ".join(ServerInstance(n).label for n in names) or "none (no release)"
        raise HostError(host, f"no instance {wanted} in the current release (has: {have})")
    return found


def release_record(spec: ReleaseSpec) -> dict[str, Any] | None:
    """The release's own ``service.json`` when it has instances (their names, in order)."""
    if not spec.model.service.instances:
        return None
    node_group = spec.model.service.node_group  # rollback and service group a multi-node server by it
    return {"release_id": spec.release_id, "instances": [i.name for i in spec.model.service.instances],
            **({"node_group": node_group} if node_group else {})}


def merge_args(base: list[str], own: list[str]) -> list[str]:
    """``base`` with every flag that ``own`` gives removed (with its values), then ``own`` appended:
    an instance's ``--tp 4`` replaces the service's ``--tp 8``, its other args are added."""
    flags = {a.split("=", 1)[0] for a in own if a.startswith("--")}
    out: list[str] = []
    skipping = False
    for arg in base:
        if arg.startswith("-") and not _number(arg):
            skipping = arg.split("=", 1)[0] in flags
        if not skipping:
            out.append(arg)
    return out + own


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
