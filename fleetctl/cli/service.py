"""``fleetctl service status|start|stop|restart [INSTANCE]``, optionally in batches (``--serial``)."""

from __future__ import annotations

from typing import Any

import click

from fleetctl import render
from fleetctl.cli.context import AppContext
from fleetctl.cli.guard import approve, yes_option
from fleetctl.cli.options import exit_code_for, host_options, rollout_options
from fleetctl.cli.router import print_gateway_steps


@click.group()
def service() -> None:
    """The inference servers of each host's current release (each instance, or only INSTANCE)."""


def _command(op: str, doc: str) -> click.Command:
    @click.argument("instance", required=False)
    @click.option("--timeout", type=float, default=300.0, show_default=True,
                  help="Seconds each started server has to answer /health.")
    @rollout_options
    @yes_option
    @host_options
    @click.pass_obj
    def command(app: AppContext, instance: str | None, timeout: float, rollout: Any, check: bool = False) -> int:
        return run_service(app, op, instance, timeout, rollout, check)

    command.__doc__ = doc
    if op != "status":  # every op that changes hosts has a dry run
        command = click.option("--check", is_flag=True, help=f"Say per server what {op} would do; change "
                                                             "nothing (no lock, no journal).")(command)
    return service.command(name=op)(command)


status = _command("status", "Each server: running, /health, the supervisor's restarts and last exit.")
start = _command("start", "Start servers that are not running; each must answer /health.")
stop = _command("stop", "Stop the servers (the systemd unit stays enabled; a boot starts them again).")
restart = _command("restart", "Restart the servers in order; each must answer /health again.")


def run_service(app: AppContext, op: str, instance: str | None, timeout: float, rollout: Any,
                check: bool = False) -> int:
    from fleetctl.cli.release import mark_failed
    from fleetctl.liveness import who
    from fleetctl.release import group_rollback
    from fleetctl.release.batched import run_batched, skipped_results
    from fleetctl.release.service_ops import service_host

    command = " ".join(["fleetctl service", op, *([instance] if instance else [])])
    if op != "status" and not check:  # a check changes nothing: no question
        approve(app, f"service {op}", f"service {op} {instance or 'every server'} (each must answer /health)"
                if op != "stop" else f"service stop {instance or 'every server'}", rollout.serial, rollout.group_var)
    holder = who(command)
    halted, journal = None, None
    with app.fleet(read_only=op == "status" or check) as fleet:
        def one(ctx: Any) -> Any:
            return service_host(ctx, op, instance, holder, timeout, check)

        if op != "status" and not check:  # journaled, in one batch or in --serial's
            # a multi-node server's nodes: one batch, in step, failing as one (release/group_rollback.py)
            rollout, as_one = group_rollback.in_groups(fleet, app.inventory.hosts, rollout,
                                                       lambda var: group_rollback.after_service_batch(fleet, var))
            run = run_batched(fleet, one, rollout, command, lambda r: r.ok and r.value is not None and r.value.ok,
                              app.inventory.folder, after_batch=as_one)
            results, halted, journal = skipped_results(run), run.halted, run.journal
        else:
            results = fleet.map(one)
    mark_failed(results, lambda r: r.ok, _reason)
    if app.json:
        render.emit_json({**render.results_json(results, lambda r: r.to_dict()), "halted": halted,
                          "journal": journal})
        return exit_code_for(results)
    rows = []
    for name, res in results.items():
        would = res.value.would if res.value else []
        for i, server in enumerate(res.value.servers if res.value else [{}]):
            rows.append([name if i == 0 else "", render.status_text(res) if i == 0 else "",
                         str(server.get("name") or ""), _state(server), str(server.get("health") or ""),
                         str(server.get("pid") or ""), *([would[i] if i < len(would) else ""] if check else [])])
    out = render.console()
    out.print(render.table(f"service {op}" + (" (check: nothing changed)" if check else ""),
                           ["host", "status", "server", "service", "health", "pid", *(["would"] if check else [])],
                           rows))
    print_gateway_steps(results)
    render.print_failures(results)
    if halted:
        out.print(render.cell(f"halted: {halted}"))
    if journal:
        out.print(render.cell(f"journal: {journal}"))
    out.print(render.summary_line(results))
    return exit_code_for(results)


def _state(server: dict[str, Any]) -> str:
    if not server:
        return ""
    state = "running" if server.get("running") else "stopped"
    if server.get("restarts"):
        state += f" (restarted {server['restarts']}x, last {server.get('last_exit')})"
    return state


def _reason(r: Any) -> str:
    gate = r.failed_gate()
    return f"{gate.name}: {gate.detail}" if gate else "failed"
