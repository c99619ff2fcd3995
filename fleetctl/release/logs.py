"""``fleetctl logs``: the inference server's last log lines on every host, gathered like ``shell``."""

from __future__ import annotations

from fleetctl.errors import HostError
from fleetctl.release.service import control, layout_for
from fleetctl.secrets import mask_values, secret_values
from fleetctl.transport.base import CommandResult, HostSession


def service_logs(session: HostSession, lines: int, since: str | None = None) -> CommandResult:
    """The journal of the service's unit under systemd, else the supervisor's log (secrets masked)."""
    layout = layout_for(session.vars)
    answer = session.call("service_host", {**control(layout, "logs"), "lines": lines, "since": since})
    if answer.get("exists") is False:
        raise HostError(session.name, f"no server log at {answer['source']} (no release started here)")
    text = "\n".join(answer.get("lines") or [])
    text = mask_values(text, secret_values(session.vars))
    return CommandResult(f"logs {answer.get('source')}", 0, text + ("\n" if text else ""), "")
