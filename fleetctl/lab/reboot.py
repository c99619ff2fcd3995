"""A lab host that reboots: each start has its own boot id, and the host can ask to be restarted.

A real reboot cannot happen inside the lab (its hosts share this machine's kernel), so the lab
gives the two things a reboot is judged by: ``/proc/sys/kernel/random/boot_id`` on a lab host is a
file of its own (bound over the kernel's at each start, a new id each time), and the command
``/etc/fleetctl-lab/restart-this-lab-host`` run on the host asks for a restart: while
``serve_restarts(lab_dir)`` runs on this machine, the host is stopped (its sshd and everything
running in it) and started again, as after a reboot. The playbook module ``reboot`` then sees the
connection drop and a new boot id, exactly as on a real host.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetctl.lab.boot import REQUEST, RESTART_COMMAND, pending
from fleetctl.lab.state import LabPaths

__all__ = ["RESTART_COMMAND", "serve_restarts"]


@contextmanager
def serve_restarts(directory: Path, interval: float = 0.2) -> Iterator[list[str]]:
    """Restart each lab host that asks (RESTART_COMMAND) while the body runs; yields the hosts restarted."""
    from fleetctl.lab.fleet import start_host, stop_host

    paths = LabPaths(directory)
    done: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.wait(interval):
            for name in pending(paths):
                (paths.host_dir(name) / "etc" / "fleetctl-lab" / REQUEST).unlink(missing_ok=True)
                stop_host(directory, name)
                start_host(directory, name)
                done.append(name)

    thread = threading.Thread(target=serve, name="lab-restarts", daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join(timeout=30)
