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


def test_the_open_files_limit_is_raised_to_the_hard_one() -> None:
    """A soft 1,024 (a common default) is less than 1,000 hosts' connections: a fleet raises it."""
    import subprocess
    import sys

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = ("import resource; from fleetctl.transport import fdwait; fdwait.raise_open_files_limit(); "
            "print(*resource.getrlimit(resource.RLIMIT_NOFILE))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)))
    assert done.stdout.split() == [str(hard), str(hard)], done.stdout + done.stderr
