"""``hosts``: list the selected hosts with their merged variables; ``hosts trust`` pins keys."""

from __future__ import annotations

from typing import Any

import click

from fleetctl import render
from fleetctl.cli.context import AppContext
from fleetctl.cli.options import exit_code_for, host_options


@click.group(invoke_without_command=True)
@host_options
@click.pass_context
def hosts(ctx: click.Context) -> int:
    """List hosts matching the pattern, with groups and merged vars (as ansible-inventory does)."""
    if ctx.invoked_subcommand is not None:
        return 0
    app: AppContext = ctx.obj
    selected = app.selected_hosts()
    logins = {h.name: login_of(app, h) for h in selected}
    if app.json:
        render.emit_json({"hosts": [{**h.to_dict(), "login": logins[h.name]} for h in selected]})
        return 0
    rows = []
    for h in selected:
        got = logins[h.name]
        where = got.get("error") or got["address"] + (f" via {','.join(got['via'])}" if got["via"] else "")
        become = got["become"] or ""
        rows.append([h.name, ",".join(h.groups), where, become, h.connection.venv or ""])
    out = render.console()
    out.print(render.table(None, ["host", "groups", "connection", "become", "venv"], rows))
    out.print(f"{len(selected)} hosts")
    return 0


def login_of(app: AppContext, host: Any) -> dict[str, Any]:
    """How the transport will reach ``host``: the one resolver's answer (inventory > CLI > ssh_config >
    default, ``transport/target.py``), its bastions nearest first, and whom it becomes."""
    from fleetctl.errors import FleetError
    from fleetctl.transport.target import resolve_become, resolve_target

    spec = host.connection
    become = resolve_become(spec, app.connect)
    if spec.kind == "local":
        return {"address": "local", "via": [], "become": become.user if become else None}
    try:
        target = resolve_target(app.inventory, spec, app.connect, become=become)
    except FleetError as exc:
        return {"address": None, "via": [], "become": None, "error": f"unresolvable: {exc}"}
    hops: list[str] = []
    via = target.jump
    while via is not None:
        hops.insert(0, f"{via.user}@{via.hostname}:{via.port}")
        via = via.jump
    if target.proxy_command:
        hops.append(f"ProxyCommand {target.proxy_command}")
    return {"address": f"{target.user}@{target.hostname}:{target.port}", "via": hops,
            "become": become.user if become else None}


@hosts.command()
@click.option("--replace", is_flag=True, help="Replace a pinned key that changed (after checking it).")
@host_options
@click.pass_obj
def trust(app: AppContext, replace: bool) -> int:
    """Fetch each host's SSH key, show its fingerprint and pin it in known_hosts."""
    from fleetctl.trust import trust_hosts

    results = trust_hosts(app.inventory, app.selected_hosts(), replace=replace, settings=app.run_settings())
    if app.json:
        doc = render.results_json(results, lambda k: {
            "name": k.name, "type": k.key_type, "fingerprint": k.fingerprint, "state": k.state})
        for n, r in results.items():
            doc["hosts"][n]["bastions"] = r.details.get("bastions", [])
        render.emit_json(doc)
    else:
        rows = []
        for n, r in results.items():
            rows += [[f"{n} via", "bastion", b["name"], b["type"], b["fingerprint"], b["state"], b["file"]]
                     for b in r.details.get("bastions", [])]
            rows.append([n, render.status_text(r), r.value.name if r.value else "",
                         r.value.key_type if r.value else "", r.value.fingerprint if r.value else "",
                         r.value.state if r.value else r.reason, r.details.get("file", "")])
        render.console().print(render.table(
            None, ["host", "status", "known as", "type", "fingerprint", "state", "file"], rows))
        render.print_failures(results)
    return exit_code_for(results)
