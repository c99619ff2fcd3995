"""One way for tests to stop the servers their releases started, and wait until they are gone.

A release's server runs under its supervisor (which would start it again), in its own session, with its
working folder and log under the release and state folders. A clean-up that sends SIGKILL and goes on
can race the exit: `umount` of a test's tmpfs then fails with "target is busy" (seen in CI). So the
supervisors go first, then each server's whole process group, and the shell waits (at most 10 s) until
none is left running; a zombie counts as gone (it holds no files).
"""
from __future__ import annotations

import shlex

DEFAULT_STATE = "/var/lib/fleetctl"


def stop_services(state: str = DEFAULT_STATE) -> str:
    """Shell that stops every supervisor and server with a pidfile under STATE/service, then waits."""
    s = shlex.quote(state.rstrip("/") + "/service")
    return (
        "pids=''; "
        f"for f in {s}/*.supervisor.pid {s}/*.pid; do [ -f \"$f\" ] || continue; p=$(head -1 \"$f\"); "
        "case \"$p\" in ''|*[!0-9]*) continue;; esac; "
        "kill -9 \"$p\" 2>/dev/null; kill -9 -- -\"$p\" 2>/dev/null; pids=\"$pids $p\"; done; "
        "for i in $(seq 100); do left=''; for p in $pids; do "
        "st=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1); "
        "[ -n \"$st\" ] && [ \"$st\" != Z ] && left=\"$left $p\"; done; "
        "[ -z \"$left\" ] && break; sleep 0.1; done; true"
    )


def clean_releases(*paths: str, state: str = DEFAULT_STATE, boot: bool = True) -> str:
    """Shell that stops the services, then removes STATE, PATHS (default /opt/fleetctl) and, unless
    BOOT is false (a user's own releases have none), the boot entries that would start them again.
    PATHS are the tests' own constants, given to the shell as words (a glob such as /opt/fleetctl/* works)."""
    gone = [*(paths or ("/opt/fleetctl",)), state] + (["/etc/fleetctl/boot.d"] if boot else [])
    return f"{stop_services(state)}; rm -rf {' '.join(gone)}; true"


def unmount(path: str) -> str:
    """Shell that unmounts PATH, retrying for a few seconds while a process that just ended lets go of it."""
    p = shlex.quote(path)
    return f"for i in $(seq 50); do umount {p} 2>/dev/null && break; sleep 0.1; done; true"
