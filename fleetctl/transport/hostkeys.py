"""Host keys: checked on every connection, never disabled; pinned with ``fleetctl hosts trust``.

The known_hosts file is the inventory's own (``known_hosts`` beside the inventory file, or
the ``fleetctl_known_hosts`` var) when it exists, else the user's ``~/.ssh/known_hosts``.
paramiko is imported lazily: local-only runs and ``--help`` never load it.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import ConnectError, HostKeyError

if TYPE_CHECKING:
    import paramiko

USER_KNOWN_HOSTS = Path("~/.ssh/known_hosts").expanduser()


def known_hosts_file(inventory_path: Path, configured: str | None) -> Path:
    """Where this host's key is looked up (and pinned by ``hosts trust``)."""
    if configured:
        return Path(configured)
    beside = inventory_path.parent / "known_hosts"
    if beside.exists() or not USER_KNOWN_HOSTS.exists():
        return beside
    return USER_KNOWN_HOSTS


def key_name(hostname: str, port: int) -> str:
    """The name OpenSSH and paramiko store a key under."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def strict_policy(host: str, known_hosts: Path) -> Any:
    """A paramiko policy that refuses unknown keys with a message naming host and file."""
    import paramiko

    class RefuseUnknown(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: paramiko.PKey) -> None:
            raise HostKeyError(
                host,
                f"unknown host key {key.get_name()} {fingerprint(key)} for {hostname} "
                f"(not in {known_hosts}); check it, then run `fleetctl hosts trust -l {host}`",
            )

    return RefuseUnknown()


def changed_key_error(host: str, exc: Any, known_hosts: Path) -> HostKeyError:
    return HostKeyError(
        host,
        f"HOST KEY CHANGED for {exc.hostname}: server sent {fingerprint(exc.key)}, "
        f"{known_hosts} pins {fingerprint(exc.expected_key)}; refused (possible man-in-the-middle; "
        "if the host was reinstalled, remove its line from that file and trust it again)",
    )


@dataclass(frozen=True)
class ScannedKey:
    host: str
    name: str  # the known_hosts name: addr or [addr]:port
    key_type: str
    key_base64: str
    fingerprint: str
    state: str = ""  # new | pinned | changed


def scan_key(host: str, hostname: str, port: int, timeout: float) -> ScannedKey:
    """Fetch a server's host key over a bare SSH handshake (no authentication)."""
    import socket

    import paramiko

    try:
        sock = socket.create_connection((hostname, port), timeout=timeout)
    except OSError as exc:
        raise ConnectError(host, f"cannot connect to {hostname}:{port}: {exc.strerror or exc}") from None
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
    except (paramiko.SSHException, OSError) as exc:
        raise ConnectError(host, f"SSH handshake with {hostname}:{port} failed: {exc}") from None
    finally:
        transport.close()
    return ScannedKey(host, key_name(hostname, port), key.get_name(), key.get_base64(), fingerprint(key))


def pin_keys(path: Path, scanned: list[ScannedKey], replace: bool) -> list[ScannedKey]:
    """Add scanned keys to ``path``; a different pinned key is kept unless ``replace``."""
    import paramiko

    keys = paramiko.HostKeys(str(path)) if path.exists() else paramiko.HostKeys()
    out = []
    for item in scanned:
        pinned = keys.lookup(item.name)
        old = pinned.get(item.key_type) if pinned is not None else None
        if old is not None and old.get_base64() == item.key_base64:
            state = "pinned"
        elif old is not None and not replace:
            state = "changed"
        else:
            key = paramiko.PKey.from_type_string(item.key_type, base64.b64decode(item.key_base64))
            keys.add(item.name, item.key_type, key)
            state = "new" if old is None else "replaced"
        out.append(ScannedKey(**{**item.__dict__, "state": state}))
    path.parent.mkdir(parents=True, exist_ok=True)
    keys.save(str(path))
    return out
