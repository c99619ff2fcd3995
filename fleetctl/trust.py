"""``hosts trust``: fetch each host's key, show its fingerprint, pin it in known_hosts.

A host is reached exactly as its connection will be (``transport/target.py``: aliases,
ssh_config, bastion chains, ProxyCommand), and each key is pinned under the name that the
connection checks. A bastion's key is fetched and pinned first, the same way, then the
bastion is logged in to (its key now checked) to reach the next hop: trusting a host behind a
bastion trusts the chain, as answering each of ``ssh``'s prompts would. Hops shared by many
hosts are scanned once.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

from fleetctl.errors import FleetError, HostKeyError
from fleetctl.inventory import Host, Inventory
from fleetctl.transport import hostkeys
from fleetctl.transport.base import HostResult, Status
from fleetctl.transport.fleet import RunSettings, ssh_target
from fleetctl.transport.target import SSHTarget


def trust_hosts(
    inventory: Inventory, hosts: list[Host], replace: bool = False, settings: RunSettings | None = None,
) -> dict[str, HostResult[hostkeys.ScannedKey]]:
    """Scan keys in parallel, then pin them file by file; a changed key is refused unless ``replace``."""
    settings = settings or RunSettings()
    ssh_hosts = [h for h in hosts if h.connection.kind == "ssh"]
    results: dict[str, HostResult[hostkeys.ScannedKey]] = {
        h.name: HostResult(h.name, Status.OK, reason="local connection: no host key") for h in hosts
        if h.connection.kind != "ssh"
    }
    by_file: dict[Path, list[hostkeys.ScannedKey]] = defaultdict(list)
    bastions = _Bastions(replace)
    hops_of: dict[str, list[dict[str, Any]]] = {}

    def scan(host: Host) -> None:
        with ExitStack() as stack:
            try:
                target = ssh_target(inventory, host.connection, settings)
                hops_of[host.name] = bastions.through(host.name, target, stack)
                key = hostkeys.scan_key(host.name, target.hostname, target.port, target.connect_timeout,
                                        _socket(host.name, target, stack))
            except FleetError as exc:
                results[host.name] = HostResult(host.name, Status.UNREACHABLE,
                                                reason=getattr(exc, "reason", str(exc)))
                return
        by_file[target.known_hosts].append(key)

    with ThreadPoolExecutor(max_workers=max(1, min(settings.forks, len(ssh_hosts) or 1))) as pool:
        list(pool.map(scan, ssh_hosts))
    for path, keys in by_file.items():
        for key in hostkeys.pin_keys(path, keys, replace):
            results[key.host] = _result(key, path)
    for name, hops in hops_of.items():
        results[name].details["bastions"] = hops
    return dict(sorted(results.items()))


class _Bastions:
    """Each bastion hop pinned once (a hop reached through several hosts' chains is one hop)."""

    def __init__(self, replace: bool) -> None:
        self.replace = replace
        self.lock = threading.Lock()
        self.done: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.hop_locks: dict[tuple[Any, ...], threading.Lock] = defaultdict(threading.Lock)

    def through(self, host: str, target: SSHTarget, stack: ExitStack) -> list[dict[str, Any]]:
        """Pin every bastion of ``target``'s chain, first hop first; the rows shown for them."""
        chain: list[SSHTarget] = []
        hop = target.jump
        while hop is not None:
            chain.insert(0, hop)
            hop = hop.jump
        return [self.pin(host, hop, stack) for hop in chain]

    def pin(self, host: str, hop: SSHTarget, stack: ExitStack) -> dict[str, Any]:
        ident = (hop.hostname, hop.port, str(hop.known_hosts), hop.jump)
        with self.lock:
            hop_lock = self.hop_locks[ident]
        with hop_lock:
            if ident not in self.done:
                key = hostkeys.scan_key(host, hop.hostname, hop.port, hop.connect_timeout,
                                        _socket(host, hop, stack))
                pinned = hostkeys.pin_keys(hop.known_hosts, [key], self.replace)[0]
                self.done[ident] = {"name": pinned.name, "type": pinned.key_type,
                                    "fingerprint": pinned.fingerprint, "state": pinned.state,
                                    "file": str(hop.known_hosts)}
            row = self.done[ident]
        if row["state"] == "changed":
            raise HostKeyError(host, f"bastion {row['name']}: key changed: server sends {row['fingerprint']}, "
                                     f"{row['file']} pins another; not replaced (pass --replace once you have "
                                     "checked it)")
        return row


def _socket(host: str, target: SSHTarget, stack: ExitStack) -> Any:
    """What the handshake with ``target`` runs over: None (a new TCP connection), a channel
    through its bastion (logged in to, its key checked), or its ProxyCommand."""
    if target.proxy_command:
        import paramiko

        return stack.enter_context(closing(paramiko.ProxyCommand(target.proxy_command)))
    if target.jump is None:
        return None
    from fleetctl.transport.ssh import SSHConnector

    bastion = SSHConnector(host, target.jump)
    stack.callback(bastion.close)
    return bastion.forward(target.hostname, target.port)


def _result(key: hostkeys.ScannedKey, path: Path) -> HostResult[hostkeys.ScannedKey]:
    if key.state == "changed":
        err = HostKeyError(key.host, f"key changed: server sends {key.fingerprint}, {path} pins another; "
                                     "not replaced (pass --replace once you have checked it)")
        return HostResult(key.host, Status.FAILED, value=key, reason=err.reason, details={"file": str(path)})
    return HostResult(key.host, Status.OK, value=key, details={"file": str(path)})
