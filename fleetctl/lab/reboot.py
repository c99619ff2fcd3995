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
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetctl.lab.state import LabPaths, load_state

RESTART_COMMAND = "/etc/fleetctl-lab/restart-this-lab-host"
_REQUEST = "restart-requested"
_SCRIPT = """#!/bin/sh
# Restart this lab host as a reboot would (fleetctl/lab/reboot.py): everything on it stops and sshd
# starts again with a new boot id, done by `serve_restarts` on the lab's machine.
: > /etc/fleetctl-lab/restart-requested
"""


def boot_id_file(paths: LabPaths, name: str) -> Path:
    return paths.host_dir(name) / "boot_id"


def prepare(paths: LabPaths, name: str) -> None:
    """Before each start: a new boot id, and the restart command in the host's /etc."""
    boot_id_file(paths, name).write_text(f"{uuid.uuid4()}\n")
    folder = paths.host_dir(name) / "etc" / "fleetctl-lab"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / _REQUEST).unlink(missing_ok=True)
    script = folder / "restart-this-lab-host"
    script.write_text(_SCRIPT)
    script.chmod(0o755)
    mark_lab_host(paths, name)


def mark_lab_host(paths: LabPaths, name: str) -> None:
    """What makes this a lab host (/etc/fleetctl-lab/lab-host): a release may run fleetctl's stand-in
    server only where it is (remote/host_files.py LAB_MARKER). Written at every `lab up`, so hosts
    started before the marker existed get it too."""
    folder = paths.host_dir(name) / "etc" / "fleetctl-lab"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lab-host").write_text("fleetctl lab host: release specs with service.standin may deploy here\n")


def _pending(paths: LabPaths) -> list[str]:
    state = load_state(paths)
    hosts = [h.name for h in state.hosts] if state else []
    return [n for n in hosts if (paths.host_dir(n) / "etc" / "fleetctl-lab" / _REQUEST).exists()]


@contextmanager
def serve_restarts(directory: Path, interval: float = 0.2) -> Iterator[list[str]]:
    """Restart each lab host that asks (RESTART_COMMAND) while the body runs; yields the hosts restarted."""
    from fleetctl.lab.fleet import start_host, stop_host

    paths = LabPaths(directory)
    done: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.wait(interval):
            for name in _pending(paths):
                (paths.host_dir(name) / "etc" / "fleetctl-lab" / _REQUEST).unlink(missing_ok=True)
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
