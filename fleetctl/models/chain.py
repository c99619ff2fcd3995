"""``fleetctl models sync``, the chain as data: who sends to whom, and the ssh each link runs.

Hosts reach each other with their own ``ssh`` (the way ``venv overlay --direct`` does): BatchMode,
StrictHostKeyChecking=yes against the sending host's own known_hosts (never skipped), the receiving
host's resolved connection (hostname, port, user and jump hosts from the inventory and the
controller's ssh_config, so an alias works), become through ``sudo -n`` (a sudo that would prompt
fails at once; a host whose become needs a password is fed by the controller instead). The sending
host's key file: its host var ``direct_ssh_key`` (as ``--direct``), else its ssh defaults. The link
from the controller itself (a source folder here, or the relay) is fleetctl's own OpenSSH command
(``transport/openssh.ssh_argv``: fleetctl's known_hosts, every hop checked).
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import shlex
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fleetctl import hostpaths
from fleetctl.errors import HostError
from fleetctl.overlay.stream import DIRECT_KEY_VAR, stream_command
from fleetctl.transport import become
from fleetctl.transport.fleet import HostContext, interpreters
from fleetctl.transport.openssh import CIPHERS, keepalive_options, ssh_argv
from fleetctl.transport.target import SSHTarget

CHAIN_MODULE = "model_chain"
DEFAULT_STALL_S = 60.0
WARM_PERSIST_S = 30  # an idle warmed connection ends this long after the chain's session on it

def control_path(token: str) -> str:
    """One sync's warmed connections: the sending user's own (ssh expands ~), %C a hash of the link. Per
    sync, so each sync checks every host key afresh and never rides a connection another one made."""
    return f"~/.ssh/fleetctl-{token}-%C"


@dataclass(frozen=True)
class SyncPlan:
    """What every link of one sync is told (the same for all; each adds its own role and host)."""

    files: list[list[Any]]  # [[rel, size, sha256]] in manifest order: a file's index names it
    dest: str
    manifest_name: str
    manifest_text: str
    limit_rate: float  # bytes per second per link, 0: none
    stall_s: float
    layout: str = "folder"  # "hf_cache": files are blobs, dest a snapshot, links its [[path, blob]]
    links: list[list[str]] = field(default_factory=list)
    holder: dict[str, Any] = field(default_factory=dict)  # who syncs (the lock's holder line), and the sync's token
    stale_syncs: list[str] = field(default_factory=list)  # syncs whose controller died here: their locks taken

    def doc(self, role: str, host: str, branches: list[list[dict[str, Any]]], keys: dict[str, str],
            **extra: Any) -> dict[str, Any]:
        return {"role": role, "host": host, "files": self.files, "dest": self.dest,
                "manifest_name": self.manifest_name, "manifest_text": self.manifest_text,
                "limit_rate": self.limit_rate, "stall_s": self.stall_s, "branches": branches, "keys": keys,
                "layout": self.layout, "links": self.links, "holder": self.holder,
                "stale_syncs": self.stale_syncs,
                **extra}


def plan_bytes(doc: dict[str, Any]) -> bytes:
    body = json.dumps(doc).encode()
    return struct.pack(">I", len(body)) + body


def target_of(ctx: HostContext) -> SSHTarget:
    target: SSHTarget | None = getattr(ctx.connector, "target", None)
    if target is None or ctx.host.connection.kind != "ssh":
        raise HostError(ctx.name, f"{ctx.name} is not reached over ssh (connection {ctx.host.connection.kind}), "
                                  "so no host can send to it")
    return target


def link_command(ctx: HostContext) -> str:
    """The chain's node, run by the host's python (its inventory interpreter, else python3)."""
    return stream_command(CHAIN_MODULE, interpreters(ctx.host.connection)[0])


def jump_spec(target: SSHTarget) -> str:
    """ssh -J's user@host:port list of every jump host, outermost first."""
    hops: list[str] = []
    hop = target.jump
    while hop is not None:
        hops.insert(0, f"{hop.user}@{hop.hostname}:{hop.port}")
        hop = hop.jump
    return ",".join(hops)


def peer_argv(ctx: HostContext) -> list[str]:
    """The ssh another host runs to reach ``ctx`` and start its node (that host adds its own key)."""
    target = target_of(ctx)
    if target.become is not None and target.become.password is not None:
        raise HostError(ctx.name, f"{ctx.name}'s become needs a password, which a host-to-host link cannot give "
                                  "sudo: it is fed by the controller")
    if target.proxy_command:
        raise HostError(ctx.name, f"{ctx.name} is reached through a ProxyCommand only this machine runs")
    command = link_command(ctx)
    if target.become is not None:
        command = become.wrap(command, target.become)
    argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={max(1, math.ceil(target.connect_timeout))}", "-o", f"Ciphers={CIPHERS}",
            *keepalive_options(target.alive_interval, target.alive_count_max),
            "-p", str(target.port), "-l", target.user]
    if target.jump is not None:
        argv += ["-J", jump_spec(target)]
    return [*argv, "--", target.hostname, command]


def with_control_path(argv: list[str], token: str) -> list[str]:
    """The link's ssh, reusing a connection warmed beforehand when one exists (else it connects as usual)."""
    return [argv[0], "-o", f"ControlPath={control_path(token)}", *argv[1:]]


def warm_links(source: HostContext | None, senders: list[HostContext], entries: list[dict[str, Any]],
               keys: dict[str, str]) -> str:
    """Every host-to-host link's connection made at once (``warm_command``): entries[i] is reached by
    the host before it (the source, then each sender). The token of their ControlPaths."""
    token = secrets.token_hex(6)
    pairs = list(zip([source, *senders[:-1]], entries, strict=True))
    if source is None:
        pairs = pairs[1:]  # the first link is this machine's own ssh
    by_sender = {ctx.name: (ctx, warm_command(entry["argv"], keys.get(ctx.name), token))
                 for ctx, entry in pairs if ctx is not None}
    with ThreadPoolExecutor(max(1, min(16, len(by_sender)))) as pool:
        for future in [pool.submit(ctx.run, command, 90) for ctx, command in by_sender.values()]:
            with contextlib.suppress(Exception):  # a link that cannot be warmed connects as usual
                future.result()
    return token


def through_warmed(entries: list[dict[str, Any]], token: str, first_direct: bool) -> list[dict[str, Any]]:
    """The links' argv riding the warmed connections (the controller's own first link excepted)."""
    return [entry if (first_direct and i == 0) else {**entry, "argv": with_control_path(entry["argv"], token)}
            for i, entry in enumerate(entries)]


class EarlyWarm:
    """The chain's links warmed for every target in the background while the source builds its
    manifest and the targets check their disks: when every target turns out to need the model (a
    first sync) the chain starts on connections already made; otherwise the chain of those that do
    is warmed then (these expire WARM_PERSIST_S after they were made)."""

    def __init__(self, source: HostContext | None, targets: list[HostContext]) -> None:
        self.hosts: list[str] = []
        self.thread: threading.Thread | None = None
        self.token: str | None = None
        try:
            entries, _ = chain_entries(targets, first_from_controller=source is None)
            senders = [ctx for ctx in targets if ctx.name in {e["host"] for e in entries}]
            keys = link_keys([*([source] if source else []), *senders])
        except HostError:
            return  # said when the chain starts
        self.hosts = [e["host"] for e in entries]
        self.thread = threading.Thread(target=self.warm, args=(source, senders, entries, keys), daemon=True)
        self.thread.start()

    def warm(self, source: HostContext | None, senders: list[HostContext], entries: list[dict[str, Any]],
             keys: dict[str, str]) -> None:
        self.token = warm_links(source, senders, entries, keys)

    def result(self) -> str | None:
        if self.thread is not None:
            self.thread.join()
        return self.token


def warm_command(argv: list[str], key: str | None, token: str) -> str:
    """A shell line the sending host runs before the chain starts: a background master connection to
    the next host (authenticated, host key checked as the link itself will be), so every link's
    handshake happens at once and the chain's start costs a session per hop. It ends by itself
    WARM_PERSIST_S after its last session."""
    options = [*(["-o", "IdentitiesOnly=yes", "-i", key] if key else []), *argv[1:argv.index("--")], "--",
               argv[argv.index("--") + 1]]
    start = " ".join(shlex.quote(w) for w in ["ssh", "-o", f"ControlPath={control_path(token)}", "-o",
                                              "ControlMaster=yes", "-o", f"ControlPersist={WARM_PERSIST_S}", "-f",
                                              "-N", *options])
    return f"mkdir -p -m 700 ~/.ssh && timeout 60 {start} </dev/null >/dev/null 2>&1; exit 0"


def controller_argv(ctx: HostContext) -> list[str]:
    """fleetctl's own ssh to ``ctx`` (its known_hosts, its key, become wrapped), for the controller's links."""
    argv = ssh_argv(target_of(ctx), link_command(ctx))
    target = target_of(ctx)
    if argv is None or (target.become is not None and target.become.password is not None):
        raise HostError(ctx.name, f"{ctx.name} needs a password (login, key or sudo) that models sync cannot give "
                                  "an unattended ssh; use a key and passwordless sudo for it")
    return argv


def link_keys(contexts: list[HostContext]) -> dict[str, str]:
    """Each sending host's key file for the links it starts (host var direct_ssh_key)."""
    keys: dict[str, str] = {}
    for ctx in contexts:
        key = ctx.vars.get(DIRECT_KEY_VAR)
        if key is not None:
            if not isinstance(key, str) or not key:
                raise HostError(ctx.name, f"{DIRECT_KEY_VAR} must be a path on {ctx.name}")
            keys[ctx.name] = key
    return keys


def chain_entries(contexts: list[HostContext], first_from_controller: bool
                  ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The chain's links in order, and the hosts that cannot be a link (with their one line)."""
    entries: list[dict[str, Any]] = []
    refused: dict[str, str] = {}
    for ctx in contexts:
        try:
            argv = controller_argv(ctx) if first_from_controller and not entries else peer_argv(ctx)
        except HostError as exc:
            refused[ctx.name] = exc.reason
            continue
        entries.append({"host": ctx.name, "argv": argv, "cache_dir": hostpaths.cache_dir(ctx.vars)})
    return entries, refused


def star_entries(contexts: list[HostContext]) -> tuple[list[list[dict[str, Any]]], dict[str, str]]:
    """One branch per host, each from the controller (the relay)."""
    branches: list[list[dict[str, Any]]] = []
    refused: dict[str, str] = {}
    for ctx in contexts:
        try:
            argv = controller_argv(ctx)
            branches.append([{"host": ctx.name, "argv": argv, "cache_dir": hostpaths.cache_dir(ctx.vars)}])
        except HostError as exc:
            refused[ctx.name] = exc.reason
    return branches, refused
