"""Where, as whom and how privileged to reach one host: the one place connection settings combine.

For each setting the first source that has it wins (Ansible's rule, with OpenSSH's own
configuration beneath, as ``ansible`` gets it by running ``ssh``):

    inventory var (``-e`` included)  >  CLI option (``-u``, ``--private-key``)  >  ssh_config  >  default

The destination looked up in ssh_config is ``ansible_host`` (or the inventory name), as ssh
is given it; the default user is the local user, never root. Keys: the inventory's or the
CLI's key first, then ssh_config's ``IdentityFile``s, with ssh-agent alongside; OpenSSH's
default key files only when neither names one. A bastion chain (``jump_host``, ``-J a,b``, or
ssh_config's ``ProxyJump``) resolves hop by hop the same way; every hop is host-key-checked.

Become: ``ansible_become*`` vars > task keyword > play keyword > ``-b``/``--become-user``/``-K``.
Everything here is pure given the ssh_config: ``tests/test_target.py`` checks the table.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fleetctl import ssh_options
from fleetctl.connection import check_jump
from fleetctl.errors import InputError
from fleetctl.transport import hostkeys, ssh_config

if TYPE_CHECKING:
    from fleetctl.connection import ConnectionSpec
    from fleetctl.inventory import Inventory

MAX_HOPS = 8
T = TypeVar("T")


@dataclass(frozen=True)
class Become:
    """Run everything on the host as ``user`` through sudo (the agent starts under it)."""

    user: str = "root"
    password: str | None = field(default=None, repr=False)
    method: str = "sudo"


@dataclass(frozen=True)
class ConnectOptions:
    """The CLI's connection options: defaults that the inventory's variables override."""

    user: str | None = None
    private_key: str | None = None
    become: bool = False
    become_user: str | None = None
    become_password: str | None = field(default=None, repr=False)


AGENT_START_S = 30.0  # the least an agent's start is given (AgentClient's own default)


@dataclass(frozen=True)
class SSHTarget:
    """Everything that decides one SSH connection; ``jump`` is the previous hop's own target."""

    hostname: str
    port: int
    user: str
    known_hosts: Path
    connect_timeout: float
    key_files: tuple[str, ...] = ()
    look_for_keys: bool = True  # OpenSSH's default key files (~/.ssh/id_*)
    allow_agent: bool = True
    password: str | None = field(default=None, repr=False)
    passphrase: str | None = field(default=None, repr=False)
    proxy_command: str | None = None
    jump: SSHTarget | None = None
    become: Become | None = None
    alive_interval: float = ssh_options.DEFAULT_ALIVE_INTERVAL  # keepalive after this many idle seconds (0: none)
    alive_count_max: int = ssh_options.DEFAULT_ALIVE_COUNT_MAX  # unanswered keepalives before ssh gives up

    @property
    def key_file(self) -> str | None:
        return self.key_files[0] if self.key_files else None

    @property
    def key_name(self) -> str:
        """The name this host's key is pinned and checked under in known_hosts."""
        return hostkeys.key_name(self.hostname, self.port)

    @property
    def agent_start_s(self) -> float:
        """How long the agent's interpreter may take to start: at least the agent's own 30 s, and the
        connect timeout where the user allowed more (a host busy enough to need it is not lost)."""
        return max(AGENT_START_S, self.connect_timeout)


def resolve_become(
    spec: ConnectionSpec, options: ConnectOptions, keyword: bool | None = None, keyword_user: str | None = None,
) -> Become | None:
    on = spec.become if spec.become is not None else keyword if keyword is not None else options.become
    if not on:
        return None
    user = spec.become_user or keyword_user or options.become_user or "root"
    return Become(user=user, password=spec.become_password or options.become_password)


def resolve_target(
    inventory: Inventory, spec: ConnectionSpec, options: ConnectOptions, connect_timeout: float | None = None,
    become: Become | None = None, config: Any = None,
) -> SSHTarget:
    """The host's SSH target; an unusable ssh_config or jump chain is an ``InputError`` naming it."""
    return _Resolver(inventory, options, connect_timeout, config).target(spec, become)


def _first(*values: T | None) -> T:
    return next(v for v in values if v is not None)


class _Resolver:
    def __init__(self, inventory: Inventory, options: ConnectOptions, timeout: float | None, config: Any) -> None:
        self.inventory = inventory
        self.options = options
        self.timeout = timeout
        self.config = config

    def lookup(self, name: str) -> ssh_config.SSHConfigEntry:
        return ssh_config.lookup(name, self.config)

    def target(self, spec: ConnectionSpec, become: Become | None = None, depth: int = 0,
               via: SSHTarget | None = None) -> SSHTarget:
        found = self.lookup(spec.hostname)
        # -u and --private-key are for the hosts themselves, not their bastions (as ssh -l, -i).
        cli = self.options if depth == 0 else ConnectOptions()
        keys = tuple(k for k in (spec.key_file or cli.private_key,) if k) + found.identity_files
        target = SSHTarget(
            hostname=found.hostname,
            port=spec.port or found.port or 22,
            user=spec.user or cli.user or found.user or getpass.getuser(),
            known_hosts=hostkeys.known_hosts_file(self.inventory.folder, spec.known_hosts),
            connect_timeout=self.timeout or spec.connect_timeout,
            key_files=keys,
            look_for_keys=not keys,
            allow_agent=not (found.identities_only and keys),
            password=spec.password,
            passphrase=spec.key_passphrase,
            become=become,
            alive_interval=_first(spec.alive_interval, found.alive_interval, ssh_options.DEFAULT_ALIVE_INTERVAL),
            alive_count_max=_first(spec.alive_count_max, found.alive_count_max, ssh_options.DEFAULT_ALIVE_COUNT_MAX),
        )
        self.report_ignored(spec, found, target.known_hosts)
        if via is not None:  # a later hop of an explicit chain: reached through the one before
            return replace(target, jump=via)
        if spec.proxy_command or (found.proxy_command and not spec.jump):
            return replace(target, proxy_command=spec.proxy_command or found.proxy_command)
        chain = spec.jump or found.proxy_jump
        if chain:
            where = "jump_host" if spec.jump else f"ProxyJump in {found.source}"
            return replace(target, jump=self.chain(chain, spec, where, depth))
        return target

    def report_ignored(self, spec: ConnectionSpec, found: ssh_config.SSHConfigEntry, known_hosts: Path) -> None:
        """Options this connection leaves out (inventory ssh args, ssh_config keywords): once per run."""
        options = [*spec.ignored_ssh_args, *found.ignored]
        if ssh_options.unreported(options):
            ssh_options.report_ignored(options, self.host_name(spec), known_hosts)

    def host_name(self, spec: ConnectionSpec) -> str:
        return next((name for name, h in self.inventory.hosts.items() if h.connection is spec), spec.hostname)

    def chain(self, chain: str, spec: ConnectionSpec, where: str, depth: int) -> SSHTarget:
        """The last hop of ``a,b,...``: ``a`` with its own settings, each later hop through the one before."""
        try:
            check_jump(chain, where)
        except ValueError as exc:
            raise InputError(f"host '{spec.hostname}': {exc}") from None
        if depth >= MAX_HOPS:
            raise InputError(f"host '{spec.hostname}': bastion chain longer than {MAX_HOPS} hops (a loop?)")
        hop: SSHTarget | None = None
        for i, name in enumerate(chain.split(",")):
            hop_spec = self.hop_spec(name, spec)
            hop = self.target(hop_spec, None, depth + 1, via=hop if i else None)
        assert hop is not None
        return hop

    def hop_spec(self, name: str, spec: ConnectionSpec) -> ConnectionSpec:
        """A hop named like an inventory host uses that host's settings, reached directly (a ``-e
        jump_host=`` names itself as its own bastion too); else ``[user@]host[:port]``, its user,
        port, keys and own ProxyJump from ssh_config, as OpenSSH resolves a ProxyJump."""
        if name in self.inventory.hosts:
            return replace(self.inventory.hosts[name].connection, become=None, jump=None, proxy_command=None)
        user, _, rest = name.rpartition("@")
        hostname, _, port = rest.partition(":")
        return replace(spec, hostname=hostname, port=int(port) if port else None, user=user or None,
                       jump=None, proxy_command=None, key_file=None, password=None, key_passphrase=None,
                       become=None)
