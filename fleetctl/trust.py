"""``hosts trust``: fetch each host's key, show its fingerprint, pin it in known_hosts."""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fleetctl.errors import FleetError, HostKeyError
from fleetctl.inventory import Host, Inventory
from fleetctl.transport import hostkeys
from fleetctl.transport.base import HostResult, Status
from fleetctl.transport.fleet import RunSettings, ssh_target


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

    def scan(host: Host) -> None:
        target = ssh_target(inventory, host.connection, settings)
        try:
            key = hostkeys.scan_key(host.name, target.hostname, target.port, target.connect_timeout)
        except FleetError as exc:
            results[host.name] = HostResult(host.name, Status.UNREACHABLE, reason=getattr(exc, "reason", str(exc)))
            return
        by_file[target.known_hosts].append(key)

    with ThreadPoolExecutor(max_workers=max(1, min(settings.forks, len(ssh_hosts) or 1))) as pool:
        list(pool.map(scan, ssh_hosts))
    for path, keys in by_file.items():
        for key in hostkeys.pin_keys(path, keys, replace):
            results[key.host] = _result(key, path)
    return dict(sorted(results.items()))


def _result(key: hostkeys.ScannedKey, path: Path) -> HostResult[hostkeys.ScannedKey]:
    if key.state == "changed":
        err = HostKeyError(key.host, f"key changed: server sends {key.fingerprint}, {path} pins another; "
                                     "not replaced (pass --replace once you have checked it)")
        return HostResult(key.host, Status.FAILED, value=key, reason=err.reason, details={"file": str(path)})
    return HostResult(key.host, Status.OK, value=key, details={"file": str(path)})
