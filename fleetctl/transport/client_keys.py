"""Private key files, read once per run instead of once per host.

paramiko's ``SSHClient`` parses a ``key_filename`` on every connection, trying the RSA, ECDSA and
Ed25519 parsers in turn: three parses per host of the same file. Here a key that loads cleanly
is parsed once (again only when the file changes) and handed to paramiko as ``pkey``; anything
unusual (an encrypted key without its passphrase, a certificate beside it, a file that does not
parse) is left to paramiko as before, so its errors and messages stay the same.
"""

from __future__ import annotations

import os
import threading
from typing import Any

_CACHE: dict[tuple[str, int, int, int, str | None], Any] = {}
_LOCK = threading.Lock()


def preloaded(path: str, passphrase: str | None) -> Any:
    """The key in ``path`` as a paramiko ``PKey``, or None where paramiko should load it itself."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if os.path.exists(path + "-cert.pub"):  # paramiko pairs the key with its certificate
        return None
    key = (path, st.st_ino, st.st_size, st.st_mtime_ns, passphrase)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        import paramiko

        try:
            loaded: Any = paramiko.PKey.from_path(path, passphrase)
        except Exception:  # paramiko's own attempt says what is wrong, in its words
            loaded = None
        _CACHE[key] = loaded
        return loaded


def auth_kwargs(key_files: tuple[str, ...], passphrase: str | None) -> dict[str, Any]:
    """``pkey`` (the first key file, when it preloads) and ``key_filename`` (the others, in order):
    paramiko tries ``pkey`` first and then the files, the order the key files had."""
    if not key_files:
        return {"key_filename": []}
    first = preloaded(key_files[0], passphrase)
    if first is None:
        return {"key_filename": list(key_files)}
    return {"pkey": first, "key_filename": list(key_files[1:])}
