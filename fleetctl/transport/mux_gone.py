"""Why a command's request through the kept-connection server got no answer: the server is gone
(killed, e.g. by the kernel's out-of-memory killer, which takes the largest process) or still runs."""

from __future__ import annotations

import contextlib
from pathlib import Path


def server_failed(path: Path, exc: BaseException) -> str:
    """Why a request through the server at ``path`` got no answer: whether its process is gone
    (killed: the kernel's out-of-memory killer takes the largest process, and leaves no line in
    its log) or still runs."""
    pid = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int(path.with_suffix(".pid").read_text())
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state not in ("Z", "X"):  # a zombie (the command that started it has not reaped it) is gone
            return (f"persistent-connection server (pid {pid}) failed ({exc}); its log: {path.with_suffix('.log')}; "
                    "`fleetctl connections stop` restarts it")
    return (f"persistent-connection server{f' (pid {pid})' if pid else ''} ended during this command ({exc}); "
            f"its log: {path.with_suffix('.log')} (a kill, e.g. the kernel's out-of-memory killer, leaves no line "
            "there); the next command starts a new one")
