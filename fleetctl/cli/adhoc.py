"""``ping``, ``shell`` and ``facts``: thin commands over the core."""

from __future__ import annotations

import click

from fleetctl import adhoc, render
from fleetctl.cli.context import AppContext
from fleetctl.cli.guard import approve, yes_option
from fleetctl.cli.options import exit_code_for, host_options, venv_option


@click.command()
@host_options
@click.pass_obj
def ping(app: AppContext) -> int:
    """Reach every host: connect, start its agent, measure a round trip."""
    with app.fleet(read_only=True) as fleet:
        results = adhoc.ping(fleet)
    if app.json:
        render.emit_json(render.results_json(results, lambda v: v.to_dict()))
    else:
        rows = []
        for name, res in results.items():
            v = res.value
            rows.append([name, render.status_text(res), v.hostname if v else "", v.user if v else "",
                         v.python if v else "",
                         v.python_version if v else "", f"{v.connect_ms:.0f}" if v else "",
                         f"{v.rtt_ms:.2f}" if v else ""])
        out = render.console()
        out.print(render.table(None, ["host", "status", "hostname", "user", "interpreter", "python",
                                      "first ms", "rtt ms"], rows))
        render.print_failures(results)
        out.print(render.summary_line(results))
    return exit_code_for(results)


@click.command()
@click.argument("command")
@yes_option
@host_options
@click.pass_obj
def shell(app: AppContext, command: str) -> int:
    """Run COMMAND on the hosts of -l (required: -l all for every host); identical outputs are gathered
    under their hosts' names."""
    approve(app, "shell", f"shell: {command}")
    with app.fleet() as fleet:
        results = adhoc.shell(fleet, command)
    if app.json:
        render.emit_json(render.results_json(
            results, lambda r: {"rc": r.rc, "stdout": r.stdout, "stderr": r.stderr,
                                "duration_s": round(r.duration_s, 3)}))
    else:
        render.print_blocks(adhoc.gather(results))
        render.console().print(render.summary_line(results))
    return exit_code_for(results)


@click.command()
@venv_option
@host_options
@click.pass_obj
def facts(app: AppContext, venv: str | None) -> int:
    """Hostname, OS, CPUs, memory, disks, Pythons, GPUs (nvidia-smi), and the venv's ML stack."""
    from fleetctl import facts as core
    from fleetctl.gpu.health import Thresholds

    for host in app.selected_hosts():  # a bad GPU threshold variable is an input error, before any host
        Thresholds.from_vars(host.vars, host.name)
    with app.fleet(read_only=True) as fleet:
        results = fleet.map(lambda ctx: core.collect_facts(ctx, venv or ctx.host.connection.venv))
    if app.json:
        render.emit_json(render.results_json(results, lambda f: f.to_dict()))
    else:
        render.print_facts(results)
    return exit_code_for(results)
