"""The lab fleet: N real OpenSSH hosts on this one machine, for end-to-end tests and demos.

Each host ``labN`` is an sshd in its own mount + UTS namespace with private /root, /opt, /srv,
/var/lib/fleetctl and /home, private account files (passwd, group, shadow, sudoers, sudoers.d)
holding the sudo user ``fleetop``, listening on its own loopback address (base + N) port 22.
"""

from fleetctl.lab.fleet import (
    DOWN,
    UP,
    LabFleet,
    LabHostStatus,
    lab_down,
    lab_status,
    lab_up,
    rekey_host,
    set_password_auth,
    start_host,
    stop_host,
)
from fleetctl.lab.state import LabPaths

__all__ = [
    "DOWN",
    "UP",
    "LabFleet",
    "LabHostStatus",
    "LabPaths",
    "lab_down",
    "lab_status",
    "lab_up",
    "rekey_host",
    "set_password_auth",
    "start_host",
    "stop_host",
]
