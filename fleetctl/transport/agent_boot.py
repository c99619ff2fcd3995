"""The agent's start code: the Python line the bootstrap runs on the host.

The agent travels inline in the start command (zlib+base64 source), so nothing needs installing
on a host. Decoding and compiling it was ~2 ms of every host's CPU on every command (of ~12 ms for
an interpreter, the agent and a one-file search): the start code keeps the compiled agent in the
private code cache the agent keeps its modules' code in (``CODE_CACHE`` of fleetctl/remote/agent.py),
keyed by the agent's source hash and the interpreter's cache tag, and loads it from there when
it is there. The cache is trusted only in a folder this user owns that nobody else may write (its
files are executed), as the agent's own module cache is; it is written atomically (a temporary
file renamed), and anything unreadable in it means compiling the shipped source instead.
"""

from __future__ import annotations

import base64
import zlib

# Stdlib only, Python >= 3.8; runs before the agent, in its __main__ namespace. DIGEST, BLOB and
# FOLDER are filled in by start_code (FOLDER: a Python expression, the agent's CODE_CACHE).
STUB = r"""
def _fleetctl_agent_code():
    def private(folder):
        st = os.stat(folder)
        return st.st_uid == os.getuid() and not st.st_mode & 0o077

    folder, tag = FOLDER, sys.implementation.cache_tag
    path = os.path.join(folder, "agent-%s-%s.code" % (DIGEST, tag)) if tag else None
    try:
        if path and private(folder):
            import marshal
            with open(path, "rb") as handle:
                code = marshal.loads(handle.read())
            if isinstance(code, type(private.__code__)):
                return code
    except (OSError, ValueError, EOFError, TypeError):
        pass
    import binascii
    import zlib
    code = compile(zlib.decompress(binascii.a2b_base64(BLOB)), "<fleetctl-agent>", "exec")
    tmp = "%s.%d" % (path, os.getpid())
    try:
        if path:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            if private(folder):
                import marshal
                with open(tmp, "wb") as handle:
                    handle.write(marshal.dumps(code))
                os.rename(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)  # a disk that filled up mid-write leaves no part of a file behind
        except OSError:
            pass
    return code


__name__ = NAME
exec(_fleetctl_agent_code())
"""

# The agent's CODE_CACHE, as fleetctl/remote/agent.py computes it on the host.
AGENT_CODE_CACHE = ('"/var/lib/fleetctl/cache/code" if os.geteuid() == 0 else '
                    'os.path.join(os.path.expanduser("~"), ".cache", "fleetctl", "code")')


def start_code(source: str, digest: str, name: str, folder: str | None = None) -> str:
    """One line of Python (``python -c``) that runs ``source`` (the agent, hash ``digest``) as module
    ``name``: its compiled code from the cache folder (``folder`` a path; None: the agent's
    CODE_CACHE), or the shipped source compiled and stored there."""
    blob = base64.b64encode(zlib.compress(source.encode(), 9)).decode()
    stub = (STUB.replace("DIGEST", repr(digest)).replace("NAME", repr(name))
            .replace("FOLDER", AGENT_CODE_CACHE if folder is None else repr(folder))
            .replace("BLOB", repr(blob)))  # last: base64 could hold the other placeholders' names
    return f"import os,sys;exec({stub.strip()!r})"
