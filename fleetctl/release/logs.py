"""``fleetctl logs``: the inference server's last log lines on every host, gathered like ``shell``."""

from __future__ import annotations

from fleetctl.errors import HostError
from fleetctl.release import instances
from fleetctl.release.servers import current_names
from fleetctl.release.service import control, layout_for
from fleetctl.secrets import mask_values, secret_values
from fleetctl.transport.base import CommandResult, HostSession


def checked_answer(host: str, answer: dict, since: str | None) -> dict:
    """The host's answer for one server's log, or one line saying why it has none to give."""
    if answer.get("exists") is False:
        raise HostError(host, f"no server log at {answer['source']} (no release started here)")
    if since and not str(answer.get("source", "")).startswith("journal "):
        # never silently all of it: only the journal can say which lines came after TIME
        raise HostError(host, f"--since needs the journal (systemd); this server logs to {answer.get('source')} "
                              "under fleetctl's supervisor: use -n instead")
    return answer


def service_logs(session: HostSession, lines: int, since: str | None = None,
                 instance: str | None = None) -> CommandResult:
    """The journal of each server's unit under systemd, else the supervisor's log (secrets masked); a
    release with instances gives each one's lines under a ``==> NAME (source) <==`` header, or only
    ``instance``'s."""
    layout = layout_for(session.vars)
    names = instances.select(current_names(session, layout) or [None], instance, session.name)
    parts, sources = [], []
    for name in names:
        answer = checked_answer(session.name, session.call("service_host", {**control(layout, "logs", name),
                                                                           "lines": lines, "since": since}), since)
        text = "\n".join(answer.get("lines") or [])
        sources.append(str(answer.get("source")))
        if len(names) > 1:
            text = f"==> {instances.ServerInstance(name).label} ({answer.get('source')}) <==\n{text}"
        parts.append(text)
    text = mask_values("\n".join(parts), secret_values(session.vars))
    return CommandResult(f"logs {', '.join(sources)}", 0, text + ("\n" if text else ""), "")
