"""Waiting for a file descriptor to be readable, at any descriptor number.

``select.select`` fails ("filedescriptor out of range") once a descriptor is past 1,023, which a
controller holding a thousand connections is; ``poll`` has no such bound.
"""

from __future__ import annotations

import select
from collections.abc import Iterable
from typing import Any

_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL


def _fd(obj: Any) -> int:
    return obj if isinstance(obj, int) else int(obj.fileno())


def readable(objs: Iterable[Any], timeout: float | None) -> list[Any]:
    """Those of ``objs`` (fds or objects with ``fileno()``) that are readable or at their end,
    waiting up to ``timeout`` seconds (``None``: until one is)."""
    poller = select.poll()
    by_fd: dict[int, Any] = {}
    for obj in objs:
        fd = _fd(obj)
        by_fd[fd] = obj
        poller.register(fd, select.POLLIN | select.POLLPRI)
    ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return [by_fd[fd] for fd, event in poller.poll(ms) if event & _READABLE]


def raise_open_files_limit() -> None:
    """The soft limit on open files up to the hard one: a soft 1,024 (a common default) is less than a
    thousand hosts' connections need. Safe here: nothing in fleetctl waits with ``select``."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):  # e.g. above the kernel's nr_open: keep what there is
            pass
