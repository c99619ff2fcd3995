"""``delegate_to`` and ``run_once``: a task that runs somewhere else, or once for its batch.

As Ansible: a delegated task runs over the connection of the host it names (an inventory host, or
``localhost``: the controller itself, through a local connection, when the inventory has no host of
that name) with the variables of the host it runs *for*: templates see ``inventory_hostname`` and
every variable of the current host, so ``delegate_to: localhost`` + ``uri`` drains *this* host at a
load balancer. The delegated host's own variables (its paths, ``fleetctl_root``) stay what the
session's modules read for where they write. Its ``become`` is the task's, then the play's, as for
any task. ``run_once`` runs the task on the first host of the batch still going and gives its result
to every such host (registered, counted, failed together), as Ansible's ``run_once``; ``batch_hosts``
names the batch's hosts.
"""

from __future__ import annotations

import threading

from fleetctl.connection import ConnectionSpec
from fleetctl.errors import InputError
from fleetctl.inventory.model import Host
from fleetctl.playbook.modules import RunServices
from fleetctl.transport.fleet import HostContext, make_connector

LOCALHOST = "localhost"


class Delegation:
    """Sessions of the hosts tasks are delegated to, opened once per run (and per ``become``)."""

    def __init__(self, services: RunServices) -> None:
        self.services = services
        self._local: dict[tuple[bool | None, str | None], HostContext] = {}
        self._lock = threading.Lock()

    def session(self, name: str, become: bool | None, become_user: str | None) -> HostContext:
        if name in self.services.inventory.hosts:
            return self.services.session_as(name, become, become_user)
        if name not in (LOCALHOST, "127.0.0.1"):
            raise InputError(f"delegate_to: {name!r} is not an inventory host (nor localhost)")
        if become:
            raise InputError("delegate_to localhost: become on the controller is not supported: run fleetctl "
                             "itself as the user you need")
        with self._lock:
            key = (become, become_user)
            if key not in self._local:
                host = Host(LOCALHOST, (), {}, ConnectionSpec(kind="local", hostname=LOCALHOST))
                settings = self.services.settings
                self._local[key] = HostContext(host, make_connector(self.services.inventory, host, settings),
                                               settings)
            return self._local[key]

    def close(self) -> None:
        for ctx in self._local.values():
            try:
                ctx.close()
            except Exception:  # best effort, as Fleet.close
                pass
