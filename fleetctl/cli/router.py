"""``fleetctl router status``: the gateways in front of the servers (``router_url`` in the inventory),
and the gateway steps a deploy, rollback or service op took (or, in check mode, would take)."""

from __future__ import annotations

from typing import Any

import click

from fleetctl import render
from fleetctl.cli.context import AppContext
from fleetctl.cli.options import exit_code_for, host_options
from fleetctl.transport.base import HostResult, HostSession


@click.group()
def router() -> None:
    """The SGLang Model Gateways (smg) named by the inventory variable router_url."""


@router.command()
@host_options
@click.pass_obj
def status(app: AppContext) -> int:
    """Each gateway's workers: health, load, and which of the selected hosts' servers are out and why."""
    from fleetctl.errors import ExitCode, InputError
    from fleetctl.gateway.status import gateway_status
    from fleetctl.gateway.workers import gateways_of

    hosts = app.selected_hosts()
    gateways = sorted({g for h in hosts for g in gateways_of(h.name, h.vars)})
    if not gateways:
        raise InputError("no gateway: set router_url (a URL or a list) for the hosts behind one")
    with app.fleet(read_only=True) as fleet:
        found = fleet.map(_host_workers)
    listed = gateway_status(gateways, found)
    if app.json:
        render.emit_json({"gateways": [g.to_dict() for g in listed],
                          **render.results_json(found, lambda r: r)})
    else:
        out = render.console()
        for g in listed:  # the gateway's URL on a line of its own: whole, never folded in a column
            out.print(render.cell(f"gateway {g.url}" + (f": unreachable: {g.error}" if g.error else "")),
                      soft_wrap=True)
            rows = [[w.url, w.host or "-", w.status, "yes" if w.healthy else "no", str(w.load), w.why]
                    for w in g.workers]
            if rows:
                out.print(render.table(None, ["worker", "host", "status", "healthy", "load", "why"], rows,
                                       whole=("worker",)))
        render.print_failures(found)
    code = exit_code_for(found)
    if any(g.error for g in listed):
        return max(code, int(ExitCode.HOST_FAILED))
    return max(code, 1) if any(not w.serving for g in listed for w in g.workers) else code


def print_gateway_steps(results: dict[str, HostResult[Any]]) -> None:
    """Each host's gateway steps (out, drained, back in; ``would ...`` in check mode), one line each."""
    out = render.console()
    for name, res in results.items():
        for gate in getattr(res.value, "gates", None) or []:
            if gate.name.startswith("gateway"):
                out.print(render.cell(f"{name}: {gate.name}: {gate.detail}"), soft_wrap=True)  # whole, piped too


def _host_workers(session: HostSession) -> list[dict[str, Any]]:
    """The host's servers as gateway workers: url, and what the host says of each (running, /health)."""
    from fleetctl.gateway.workers import expected_workers, gateways_of
    from fleetctl.release import instances as insts
    from fleetctl.release.manage import server_status
    from fleetctl.release.service import layout_for

    if not gateways_of(session.name, session.vars):
        return []
    layout = layout_for(session.vars)
    state = session.call("release_host", {"op": "state", **layout.params()})
    servers = [server_status(session, layout, name) for name in insts.names_of(state.get("service"))]
    return expected_workers(session.name, session.vars, servers, state.get("current"))
