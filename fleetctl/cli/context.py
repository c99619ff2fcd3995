"""What every command gets through ``ctx.obj``: global options, the inventory loaded once."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.errors import InputError

if TYPE_CHECKING:
    from fleetctl.inventory import Host, Inventory
    from fleetctl.transport.fleet import Fleet, RunSettings
    from fleetctl.transport.target import ConnectOptions
    from fleetctl.vault import Vault


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while an inventory and its fleet are built: they make
    objects that all stay alive, so its passes over them free nothing (~14 ms of CPU for 200 hosts,
    a thirtieth of a kept-connection ping)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass
class AppContext:
    inventory_paths: tuple[str, ...]
    limit: str | None
    forks: int
    json: bool
    verbose: int
    extra_vars: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    persist: float = 0.0
    connect: ConnectOptions | None = None  # -u, --private-key, -b, --become-user, -K
    vault: Vault | None = None  # --vault-password-file, --vault-id, --ask-vault-pass
    _inventory: Inventory | None = None

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            if not self.inventory_paths:
                raise InputError("no inventory: pass -i PATH or set FLEETCTL_INVENTORY")
            from fleetctl.inventory import load_inventory

            with collector_paused():
                self._inventory = load_inventory(self.inventory_paths, self.extra_vars, self.vault)
        return self._inventory

    def selected_hosts(self, limit: str | None = None) -> list[Host]:
        return self.inventory.select(limit if limit is not None else self.limit)

    def run_settings(self, **overrides: Any) -> RunSettings:
        from fleetctl.transport.fleet import RunSettings
        from fleetctl.transport.target import ConnectOptions

        fields: dict[str, Any] = {"forks": self.forks, "command_timeout": self.timeout,
                                  "connect": self.connect or ConnectOptions(), **overrides}
        return RunSettings(**fields)

    def fleet(self, limit: str | None = None, *, read_only: bool = False, in_venv: str | bool = False) -> Fleet:
        """The selected hosts' fleet. Only ``read_only`` commands use kept connections (``--persist``):
        a change always runs on connections of its own, so nothing it holds outlives it.
        ``in_venv``: the command works in this venv (True: each host's venv var), so the agents
        start under its python (``RunSettings.agent_in_venv``)."""
        from fleetctl.transport.fleet import Fleet

        persist = self.persist if read_only else 0.0
        # A read-only command's fan-out is one pass: over many fresh connections, spread over worker
        # processes (transport/spread.py); a change keeps every host's connection in this process.
        settings = self.run_settings(persist=persist, workers=0 if read_only and not persist else 1,
                                     agent_in_venv=bool(in_venv),
                                     venv=in_venv if isinstance(in_venv, str) else None)
        hosts = self.selected_hosts(limit)
        with collector_paused():
            return Fleet(self.inventory, hosts, settings)
