"""Host keys: checked on every connection, never disabled; pinned with ``fleetctl hosts trust``.

The known_hosts file is the inventory's own (``known_hosts`` beside the inventory file, or
the ``fleetctl_known_hosts`` var) when it exists, else the user's ``~/.ssh/known_hosts``.
paramiko is imported lazily: local-only runs and ``--help`` never load it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import ConnectError, HostKeyError

if TYPE_CHECKING:
    import paramiko

USER_KNOWN_HOSTS = Path("~/.ssh/known_hosts").expanduser()


def known_hosts_file(inventory_folder: Path, configured: str | None) -> Path:
    """Where this host's key is looked up (and pinned by ``hosts trust``)."""
    if configured:
        return Path(configured)
    beside = inventory_folder / "known_hosts"
    if beside.exists() or not USER_KNOWN_HOSTS.exists():
        return beside
    return USER_KNOWN_HOSTS


def key_name(hostname: str, port: int) -> str:
    """The name OpenSSH and paramiko store a key under."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def load_known_hosts(path: Path) -> tuple[paramiko.HostKeys, set[str]]:
    """The keys a known_hosts file pins, and the keys it marks ``@revoked`` (base64).

    Read line by line as OpenSSH does: comments, ``@cert-authority`` lines (fleetctl checks
    plain keys only) and lines that do not parse are skipped, where paramiko's own loader
    would stop at the first of them."""
    import paramiko

    keys, revoked = paramiko.HostKeys(), set[str]()
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return keys, revoked
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if fields[0] == "@revoked" and len(fields) >= 4:
            revoked.add(fields[3])
            continue
        if fields[0].startswith("@"):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line)
        except (paramiko.SSHException, ValueError, TypeError):
            continue
        if entry is not None and entry.key is not None:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)
    return keys, revoked


@dataclass
class _Pins:
    """One known_hosts file, parsed once per run: plain names indexed, hashed names scanned.
    Each pin keeps its line's position, so a later line wins as in paramiko's ``HostKeys``."""

    stamp: tuple[int, int, int]
    plain: dict[str, list[tuple[int, str, paramiko.PKey]]] = field(default_factory=dict)
    hashed: list[tuple[int, str, str, paramiko.PKey]] = field(default_factory=list)  # (n, |1|name, type, key)
    revoked: frozenset[str] = frozenset()


_PINS: dict[Path, _Pins] = {}
_PINS_LOCK = threading.Lock()


def _stamp(path: Path) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (0, 0, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _pins(path: Path) -> _Pins:
    """The file's pins, parsed again only when it changed (inode, size or mtime): every host of a
    run reads the same file, and parsing all of it for each host made a connection cost O(hosts)."""
    stamp = _stamp(path)
    with _PINS_LOCK:
        cached = _PINS.get(path)
        if cached is not None and cached.stamp == stamp:
            return cached
        keys, revoked = load_known_hosts(path)
        pins = _Pins(stamp, revoked=frozenset(revoked))
        for n, entry in enumerate(keys._entries):  # type: ignore[attr-defined]  # in file order
            for name in entry.hostnames:
                if name.startswith("|1|"):
                    pins.hashed.append((n, name, entry.key.get_name(), entry.key))
                else:
                    pins.plain.setdefault(name, []).append((n, entry.key.get_name(), entry.key))
        _PINS[path] = pins
        return pins


def pinned_for(path: Path, name: str) -> tuple[dict[str, paramiko.PKey], frozenset[str]]:
    """The keys ``path`` pins for ``name`` by key type (plain or hashed names, as paramiko's
    ``HostKeys.lookup`` matches them), and the keys it marks ``@revoked`` (base64)."""
    import paramiko

    pins = _pins(path)
    found = list(pins.plain.get(name, ()))
    for n, hashed, key_type, key in pins.hashed:
        try:
            if paramiko.HostKeys.hash_host(name, hashed) == hashed:
                found.append((n, key_type, key))
        except (AssertionError, ValueError, TypeError):  # a malformed salt never matches
            continue
    return {key_type: key for _n, key_type, key in sorted(found, key=lambda f: f[0])}, pins.revoked


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


def scan_key(host: str, hostname: str, port: int, timeout: float, sock: Any = None) -> ScannedKey:
    """Fetch a server's host key over a bare SSH handshake (no authentication), on a new TCP
    connection or on ``sock`` (a channel through a bastion, a ProxyCommand)."""
    import socket

    import paramiko

    if sock is None:
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
    """Add scanned keys to ``path``; a different pinned key is kept unless ``replace``.

    The file is edited as text, as ssh-keygen -R and ssh's own additions do: new keys are
    appended, a replaced key's own lines (plain or hashed names) are dropped, and every other
    line (comments, ``@cert-authority``, ``@revoked``, other hosts) stays as it was."""
    import paramiko

    keys, _revoked = load_known_hosts(path)
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    out = []
    for item in scanned:
        pinned = keys.lookup(item.name)
        old = pinned.get(item.key_type) if pinned is not None else None
        if old is not None and old.get_base64() == item.key_base64:
            state = "pinned"
        elif old is not None and not replace:
            state = "changed"
        else:
            if old is not None:
                lines = [kept for line in lines if (kept := _without(line, item.name, item.key_type))]
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
            lines.append(f"{item.name} {item.key_type} {item.key_base64}\n")
            key = paramiko.PKey.from_type_string(item.key_type, base64.b64decode(item.key_base64))
            keys.add(item.name, item.key_type, key)
            state = "new" if old is None else "replaced"
        out.append(ScannedKey(**{**item.__dict__, "state": state}))
    if any(k.state in ("new", "replaced") for k in out):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.fleetctl-tmp")
        tmp.write_text("".join(lines))
        tmp.replace(path)
    return out


def _without(line: str, name: str, key_type: str) -> str:
    """A known_hosts line without ``name``'s pin of a ``key_type`` key (plain or hashed name):
    the line itself when it does not pin it, "" when ``name`` was all it named."""
    import paramiko

    fields = line.split(None, 2)
    if len(fields) < 3 or fields[0].startswith(("#", "@")) or fields[1] != key_type:
        return line
    names = fields[0].split(",")
    kept = [n for n in names if n != name and not (
        n.startswith("|1|") and n.count("|") == 3 and paramiko.HostKeys.hash_host(name, n.split("|")[2]) == n)]
    if len(kept) == len(names):
        return line
    return f"{','.join(kept)} {fields[1]} {fields[2]}" if kept else ""
