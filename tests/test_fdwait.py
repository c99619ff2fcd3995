"""``fdwait.readable``: poll-based, so a descriptor past 1,023 (where select fails) is waited on too."""

from __future__ import annotations

import os
import resource
import time

from fleetctl.transport import fdwait


def test_readable_at_any_descriptor_number_with_timeout_and_end() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1400:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1600), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        r, w = os.pipe()
        assert r > 1023
        start = time.monotonic()
        assert fdwait.readable([r], 0.2) == []  # nothing yet: waits, then says so
        assert time.monotonic() - start >= 0.15
        os.write(w, b"x")
        assert fdwait.readable([r, w], 0) == [r]  # only what can be read
        os.read(r, 1)
        os.close(w)
        assert fdwait.readable([r], None) == [r]  # the other end closed: readable (read gives b"")
        os.close(r)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
