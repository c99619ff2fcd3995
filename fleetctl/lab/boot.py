"""Each lab host start's boot id and the host's restart command (what ``reboot.py`` serves): the pieces a
host's files need before its sshd starts."""

from __future__ import annotations

import uuid
from pathlib import Path

from fleetctl.lab.state import LabPaths, load_state

RESTART_COMMAND = "/etc/fleetctl-lab/restart-this-lab-host"
REQUEST = "restart-requested"
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
    (folder / REQUEST).unlink(missing_ok=True)
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


def pending(paths: LabPaths) -> list[str]:
    state = load_state(paths)
    hosts = [h.name for h in state.hosts] if state else []
    return [n for n in hosts if (paths.host_dir(n) / "etc" / "fleetctl-lab" / REQUEST).exists()]
