"""``hosts``: list the selected hosts with their merged variables; ``hosts trust`` pins keys."""

from __future__ import annotations

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
    if app.json:
        render.emit_json({"hosts": [h.to_dict() for h in selected]})
        return 0
    rows = []
    for h in selected:
        c = h.connection
        where = "local" if c.kind == "local" else f"{c.user or 'root'}@{c.hostname}:{c.port}"
        rows.append([h.name, ",".join(h.groups), where + (f" via {c.jump}" if c.jump else ""), c.venv or ""])
    out = render.console()
    out.print(render.table(None, ["host", "groups", "connection", "venv"], rows))
    out.print(f"{len(selected)} hosts")
    return 0


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
