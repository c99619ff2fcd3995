"""What every command gets through ``ctx.obj``: global options, the inventory loaded once."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.errors import InputError

if TYPE_CHECKING:
    from fleetctl.config import ProjectConfig
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
class LoginOptions:
    """The global options behind ``connect`` and ``vault``, as given (before or after the command)."""

    user: str | None = None
    private_key: str | None = None
    become: bool = False
    become_user: str | None = None
    ask_become_pass: bool = False
    vault_password_files: tuple[str, ...] = ()
    vault_ids: tuple[str, ...] = ()
    ask_vault_pass: bool = False


@dataclass
class AppContext:
    """The global options, which a command's own copy of them may change (``cli/global_options.py``);
    what is built from them (the inventory, the connection options, the vault) is built on first use,
    after every option was read."""

    inventory_paths: tuple[str, ...]
    limit: str | None
    forks: int
    json: bool
    verbose: int
    extra_vars: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None
    persist: float = 0.0
    login: LoginOptions = field(default_factory=LoginOptions)
    config: ProjectConfig | None = None  # fleetctl.cfg / ansible.cfg: below the CLI and the environment
    assume_yes: bool = False  # --yes: a command that changes hosts does not ask (cli/guard.py)
    _inventory: Inventory | None = None
    _connect: ConnectOptions | None = None
    _vault: Vault | None = None

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            paths = self.inventory_source()
            if not paths:
                raise InputError("no inventory: pass -i PATH, set FLEETCTL_INVENTORY or 'inventory' in "
                                 "fleetctl.cfg/ansible.cfg")
            from fleetctl.inventory import load_inventory
            from fleetctl.secrets import register_declared

            with collector_paused():
                self._inventory = load_inventory(paths, self.extra_vars, self.vault)
            register_declared(h.vars for h in self._inventory.hosts.values())  # masked in every output
        return self._inventory

    def reload_inventory(self) -> Inventory:
        """The inventory built again from the options as they are now (a resume restored its -e and -l)."""
        self._inventory = None
        return self.inventory

    def inventory_source(self) -> tuple[str, ...]:
        """-i, else FLEETCTL_INVENTORY, else the config file's ``inventory``."""
        import os

        from fleetctl.inventory.sources import env_sources

        if self.inventory_paths:
            return self.inventory_paths
        if os.environ.get("FLEETCTL_INVENTORY"):
            return tuple(env_sources(os.environ["FLEETCTL_INVENTORY"]))
        configured = self.config.get("inventory") if self.config else None
        return tuple(configured.split(",")) if configured else ()

    @property
    def connect(self) -> ConnectOptions:
        """-u, --private-key, -b, --become-user, -K (asked here: once, before connecting), over the config file's."""
        if self._connect is None:
            from fleetctl.cli.prompts import connect_options

            given, cfg = self.login, self.config
            self._connect = connect_options(
                given.user or (cfg.get("remote_user") if cfg else None),
                given.private_key or (cfg.get("private_key_file") if cfg else None),
                given.become or bool(cfg and cfg.flag("become")),
                given.become_user or (cfg.get("become_user") if cfg else None), given.ask_become_pass)
        return self._connect

    @property
    def vault(self) -> Vault:
        if self._vault is None:
            import os

            from fleetctl.cli.prompts import vault_options

            files = self.login.vault_password_files
            if not files and os.environ.get("FLEETCTL_VAULT_PASSWORD_FILE"):
                files = (os.environ["FLEETCTL_VAULT_PASSWORD_FILE"],)
            configured = self.config.get("vault_password_file") if self.config else None
            if not files and not self.login.vault_ids and configured:
                files = (configured,)
            self._vault = vault_options(files, self.login.vault_ids, self.login.ask_vault_pass)
        return self._vault

    def changed_login(self) -> None:
        """A command's own -u/-b/--vault-... came after the group's: build them again."""
        self._connect = self._vault = None

    def selected_hosts(self, limit: str | None = None) -> list[Host]:
        return self.inventory.select(limit if limit is not None else self.limit)

    def run_settings(self, **overrides: Any) -> RunSettings:
        from fleetctl.transport.fleet import RunSettings

        fields: dict[str, Any] = {"forks": self.forks, "command_timeout": self.timeout,
                                  "connect": self.connect, **overrides}
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
