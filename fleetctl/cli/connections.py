"""``connections list|stop``: the SSH connections kept between commands (``--persist``)."""

from __future__ import annotations

import click

from fleetctl import render
from fleetctl.cli.context import AppContext


@click.group()
def connections() -> None:
    """Connections kept by --persist / FLEETCTL_PERSIST (like OpenSSH's ControlPersist)."""


@connections.command("list")
@click.pass_obj
def list_connections(app: AppContext) -> int:
    """Show the kept connections: host, address, interpreters with an agent, idle time."""
    from fleetctl.transport import mux

    kept = mux.server_status()
    if app.json:
        render.emit_json({"running": kept is not None, "connections": kept or []})
        return 0
    out = render.console()
    if kept is None:
        out.print("no persistent-connection server is running")
        return 0
    rows = [[k["host"], k["address"], ", ".join(k["pythons"]), f"{k['idle_s']:.0f}",
             "yes" if k["in_use"] else "no"] for k in kept]
    out.print(render.table(None, ["host", "address", "agents", "idle s", "in use"], rows))
    out.print(f"{len(kept)} kept connection(s); socket {mux.socket_path()}")
    return 0


@connections.command("stop")
@click.pass_obj
def stop_connections(app: AppContext) -> int:
    """Close every kept connection and stop the server now (it also stops itself when idle)."""
    from fleetctl.transport import mux

    held = mux.stop_server()
    if app.json:
        render.emit_json({"stopped": held is not None, "closed": held or 0})
    elif held is None:
        render.console().print("no persistent-connection server is running")
    else:
        render.console().print(f"stopped; closed {held} connection(s)")
    return 0
