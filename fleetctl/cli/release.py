"""``deploy``, ``rollback``, ``status`` and ``releases``: a release's life on the fleet."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from fleetctl import render
from fleetctl.cli import complete
from fleetctl.cli.context import AppContext
from fleetctl.cli.guard import approve, yes_option
from fleetctl.cli.options import exit_code_for, host_options, rollout_options
from fleetctl.cli.router import print_gateway_steps
from fleetctl.transport.base import HostResult, Status

break_lock_option = click.option(
    "--break-lock", is_flag=True,
    help="Break a stale deploy lock (its run's pid is dead, or it ran on another controller): "
         "ends the agent that holds it. A live run's lock is never broken.")
wait_option = click.option(
    "--wait", type=click.FloatRange(0, 3600), default=0.0, metavar="SECONDS",
    help="A host another run holds: wait up to SECONDS for that run to end (at most 3600), then refuse it.")


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--check", is_flag=True, help="Plan only: inspect hosts and apply patches in memory; write nothing.")
@click.option("--diff", "show_diff", is_flag=True, help="Show the patched files' diffs and the service environment.")
@click.option("--rebuild", is_flag=True, help="Build the release again (as <id>.b<base fingerprint>) even where "
              "the build of it that is serving came from a base that has changed since.")
@click.option("--stage", is_flag=True, help="Build, patch, validate and verify the release on each host without "
              "switching; a later deploy of SPEC there only switches, restarts and gates.")
@break_lock_option
@wait_option
@rollout_options
@yes_option
@host_options
@click.pass_obj
def deploy(app: AppContext, spec_path: Path, check: bool, show_diff: bool, break_lock: bool, rebuild: bool,
           stage: bool, wait: float, rollout: Any) -> int:
    """Deploy the release SPEC: build, switch atomically, restart, health gates, roll back on failure
    (--stage: build and verify only)."""
    from fleetctl.liveness import who
    from fleetctl.release import deploy as core
    from fleetctl.release import group_rollback
    from fleetctl.release.ownership import RunClaims
    from fleetctl.release.spec import load_spec

    spec = load_spec(spec_path)
    loaded = core.load_patches(spec)
    if not check:  # a check changes nothing: no target needed, no question
        approve(app, "deploy", f"deploy {spec.release_id}" + (" (--stage: build and verify, no switch)" if stage
                else " (build, switch, restart, health gates, roll back on failure)"),
                rollout.serial, rollout.group_var or spec.model.service.node_group)
    holder = who(f"fleetctl deploy {spec_path}" + (" --stage" if stage else ""))
    claims = RunClaims(holder, break_lock, wait)
    with app.fleet() as fleet:
        from fleetctl.release.nodegroups import annotate

        annotate(fleet.contexts, app.inventory.hosts, spec.model.service.node_group)
        group = spec.model.service.node_group
        if group and not rollout.group_var:  # a multi-node server moves as one
            rollout = replace(rollout, group_var=group)
        as_one = None if not group or stage else group_rollback.after_batch(fleet, group, holder,
                                                                             spec.model.health.timeout, claims)
        results, halted = in_batches(app, fleet, rollout, holder["command"], lambda ctx: core.deploy_host(
            ctx, spec, loaded, check, holder, break_lock, rebuild, stage_only=stage, claim=claims.get(ctx.name)),
            check, claims, as_one)
    mark_failed(results, lambda r: r.ok, lambda r: _deploy_reason(r))
    if app.json:
        render.emit_json({"release": spec.release_id, **render.results_json(results, lambda r: r.to_dict()),
                          **halted})
    else:
        print_deploy(spec.release_id, results, show_diff)
        print_halted(halted)
    return exit_code_for(results)


def in_batches(app: AppContext, fleet: Any, rollout: Any, command: str, fn: Any,
               check: bool = False, claims: Any = None,
               after_batch: Any = None) -> tuple[dict[str, HostResult[Any]], dict[str, Any]]:
    """``fn`` on every host: at once (one batch), or with ``--serial`` in batches under the failure
    budget (the playbook rollout's planner, ``release/batched.py``); journaled either way (a check,
    which changes nothing, is not); the halt and the journal. ``claims``: the run owns its hosts."""
    if check:
        return fleet.map(fn), {}
    from fleetctl.release.batched import run_batched, skipped_results

    run = run_batched(fleet, fn, rollout, command, lambda r: r.ok and r.value is not None and r.value.ok,
                      app.inventory.folder, claims, after_batch)
    return skipped_results(run), {"halted": run.halted, "journal": run.journal}


def print_halted(halted: dict[str, Any]) -> None:
    for key in ("halted", "journal"):
        if halted.get(key):
            render.console().print(render.cell(f"{key}: {halted[key]}"))


def _deploy_reason(r: Any) -> str:
    gate = r.failed_gate()
    back = {"rolled-back": f"; rolled back to {r.previous}",
            "config-restored": f"; {r.release_id} back on the configuration that served"}.get(
        r.outcome, "; no previous release: service stopped")
    if r.restart_error:
        return f"restart failed: {r.restart_error}{back}"
    return f"health gate failed: {gate.name}: {gate.detail}{back}" if gate else r.outcome


def mark_failed(results: dict[str, HostResult[Any]], ok: Any, reason: Any) -> None:
    """A host whose answer is a failure (a gate failed, rolled back) counts as failed: exit 2."""
    for res in results.values():
        if res.ok and res.value is not None and not ok(res.value):
            res.status, res.reason = Status.FAILED, reason(res.value)


def print_metrics_read(results: dict[str, HostResult[Any]]) -> None:
    """Check mode: the metrics each host's gates would read (``release/live_canary.planned``), one line each."""
    out = render.console()
    for name, res in results.items():
        for gate in getattr(res.value, "gates", None) or []:
            if gate.name.endswith(("threshold: would read", "canary: would compare")):
                out.print(render.cell(f"{name}: {gate.name}: {gate.detail}"), soft_wrap=True)


def print_deploy(release_id: str, results: dict[str, HostResult[Any]], show_diff: bool) -> None:
    out = render.console()
    rows = []
    for name, res in results.items():
        v = res.value
        failed = v.failed_gate() if v else None
        gates = (f"FAILED {failed.name}" if failed else f"{len(v.gates)} passed") if v and v.gates else ""
        build = (v.build.get("clone") or f"{v.build.get('linked', 0)} linked, {v.build.get('copied', 0)} copied"
                 if v and v.build else "")
        outcome = (f"would {v.plan}" if v.plan != "unchanged" else "unchanged") if v and v.outcome == "planned" \
            else v.outcome if v else ""
        rows.append([name, render.status_text(res), outcome, v.previous or "-" if v else "", build, gates])
    out.print(render.table(f"release {release_id}", ["host", "status", "outcome", "previous", "build", "gates"], rows))
    planned = {", ".join(sorted(r.value.diffs)) for r in results.values() if r.value and r.value.diffs}
    for files in sorted(planned):
        out.print(render.cell(f"would write: {files} (--diff shows the changes)"))
    if show_diff:
        shown: set[str] = set()
        for res in results.values():
            for path, text in (res.value.diffs if res.value else {}).items():
                if text and text not in shown:  # identical diffs across hosts: once
                    shown.add(text)
                    out.print(render.cell(f"--- {path}"), style="bold")
                    render.print_diff(out, text)
    print_broken_locks(results)
    print_notes({name: res.value.note for name, res in results.items() if res.value is not None})
    print_gateway_steps(results)
    print_metrics_read(results)
    render.print_failures(results)
    out.print(render.summary_line(results))


def print_notes(notes: dict[str, str]) -> None:
    """Each note once, with the hosts that said it (eight hosts, one line: as ``shell`` gathers output)."""
    gathered: dict[str, list[str]] = {}
    for name, note in notes.items():
        if note:
            gathered.setdefault(note, []).append(name)
    for note, hosts in gathered.items():
        render.console().print(render.cell(f"{','.join(hosts)}: {note}"))


def print_broken_locks(results: dict[str, HostResult[Any]]) -> None:
    for name, res in results.items():
        h = res.value.broke_lock if res.value is not None else None
        if h:
            render.console().print(render.cell(
                f"{name}: broke the stale lock of {h.get('user', '?')}@{h.get('controller', '?')} pid "
                f"{h.get('pid', '?')} ({h.get('command', '?')}); its agent pid {h.get('agent_pid', '?')} ended"))


@click.command()
@click.option("--to", "to", metavar="RELEASE_ID", shell_complete=complete.release_ids,
              help="The release id to return to (default: the previous one).")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds to wait for /health.")
@click.option("--check", is_flag=True, help="Name each host's target release; switch nothing.")
@break_lock_option
@wait_option
@rollout_options
@yes_option
@host_options
@click.pass_obj
def rollback(app: AppContext, to: str | None, timeout: float, check: bool, break_lock: bool, wait: float,
             rollout: Any) -> int:
    """Switch back to a release already on the hosts and restart: nothing is reinstalled. The default
    target is the release before the current one in each host's history that was never rolled back
    from; a host already rolled back stays (--to goes further back), so a re-run is safe."""
    from fleetctl.liveness import who
    from fleetctl.release import group_rollback
    from fleetctl.release.manage import rollback_host
    from fleetctl.release.ownership import RunClaims

    if not check:  # a check changes nothing: no target needed, no question
        approve(app, "rollback", f"rollback to {to or 'the previous release'} (switch and restart, no reinstall)",
                rollout.serial, rollout.group_var)
    holder = who(f"fleetctl rollback {to or ''}".strip())
    claims = RunClaims(holder, break_lock, wait)
    with app.fleet() as fleet:
        rollout, as_one = group_rollback.in_groups(fleet, app.inventory.hosts, rollout, None if check else lambda var: (
            group_rollback.after_rollback_batch(fleet, var, holder, timeout, claims)))
        results, halted = in_batches(app, fleet, rollout, holder["command"], lambda ctx: rollback_host(
            ctx, to, timeout, holder, break_lock, check, claims.get(ctx.name)), check, claims, as_one)
    mark_failed(results, lambda r: r.ok, lambda r: (f"rolled back to {r.to_id} but: " if r.outcome != "returned"
                                                    else "") + "; ".join(f"{g.name}: {g.detail}" for g in r.gates
                                                                         if not g.ok))
    if app.json:
        render.emit_json({**render.results_json(results, lambda r: r.to_dict()), **halted})
    else:
        rows = [[n, render.status_text(r), *([r.value.outcome, r.value.from_id or "-", r.value.to_id] if r.value
                                             else ["", "", ""])] for n, r in results.items()]
        render.console().print(render.table(None, ["host", "status", "outcome", "from", "to"], rows))
        print_notes({name: res.value.note for name, res in results.items() if res.value is not None})
        print_broken_locks(results)
        print_gateway_steps(results)
        render.print_failures(results)
        print_halted(halted)
        render.console().print(render.summary_line(results))
    return exit_code_for(results)


@click.command()
@host_options
@click.pass_obj
def status(app: AppContext) -> int:
    """Per host: the current and previous release, the service state and its health."""
    from fleetctl.release.manage import status_host

    with app.fleet(read_only=True) as fleet:
        results = fleet.map(status_host)
    if app.json:
        render.emit_json(render.results_json(results, lambda r: r.to_dict()))
    else:
        rows = []
        for n, r in results.items():
            servers = r.value.instances if r.value else [{}]
            for i, server in enumerate(servers):
                cells = _status_cells(r.value, server) if r.value else [""] * 6
                cells[:2] = cells[:2] if i == 0 else ["", ""]  # the host's releases once, then its servers
                rows.append([n if i == 0 else "", render.status_text(r) if i == 0 else "", *cells])
        render.console().print(render.table(None, ["host", "status", "current", "previous", "server", "service",
                                                  "health", "warm-up"], rows))
        models = [[n, m["role"], m["revision"] or "?", m["state"]] for n, r in results.items()
                  for m in (r.value.models if r.value else [])]
        if models:  # the current release's models, quick tier
            render.console().print(render.table(None, ["host", "model", "revision", "complete"], models))
        render.print_failures(results)
    return exit_code_for(results)


def _status_cells(v: Any, server: dict[str, Any]) -> list[str]:
    """One server's row: its name, running/stopped with the supervisor's restarts, its health."""
    from fleetctl.release.warmup import describe

    state = "running" if server.get("running") else "stopped"
    if server.get("restarts"):
        state += f" (restarted {server['restarts']}x, last {server.get('last_exit')})"
    return [v.current or "-", v.previous or "-", str(server.get("name") or "sglang"), state,
            str(server.get("health") or "-"), describe(v.canary) if v.canary else "-"]


@click.group()
def releases() -> None:
    """The release folders on each host."""


@releases.command(name="list")
@host_options
@click.pass_obj
def list_releases(app: AppContext) -> int:
    """Every release on each host, marking current and previous."""
    from fleetctl.release.manage import status_host

    with app.fleet(read_only=True) as fleet:
        results = fleet.map(status_host)
    if app.json:
        render.emit_json(render.results_json(results, lambda r: {"current": r.current, "previous": r.previous,
                                                                   "releases": r.releases}))
        return exit_code_for(results)
    rows = []
    for name, res in results.items():
        if res.value is None:
            continue
        v = res.value
        rows += [[name, rid, "current" if rid == v.current else "previous" if rid == v.previous else ""]
                 for rid in v.releases]
    render.console().print(render.table(None, ["host", "release", ""], rows))
    render.print_failures(results)
    return exit_code_for(results)


@releases.command(name="remove")
@click.argument("release_id", metavar="RELEASE_ID", shell_complete=complete.release_ids)
@click.option("--check", is_flag=True, help="Say per host what would be removed (or why not); remove nothing.")
@yes_option
@host_options
@click.pass_obj
def remove_release(app: AppContext, release_id: str, check: bool) -> int:
    """Remove one release folder from each host (never the current or the previous one), and the
    base venvs built from a lock that no release uses any more."""
    from fleetctl.liveness import who
    from fleetctl.release.hostlock import host_lock
    from fleetctl.release.identity import remove_release as remove
    from fleetctl.release.service import layout_for

    if not check:  # a check changes nothing: no question, no lock
        approve(app, "releases remove", f"remove release {release_id} (never the current or previous one)")
    holder = who(f"fleetctl releases remove {release_id}")

    def one(ctx: Any) -> dict[str, Any]:
        layout = layout_for(ctx.vars)
        if check:
            return remove(ctx, layout, release_id, check=True)
        with host_lock(ctx, layout, holder):
            return remove(ctx, layout, release_id)

    with app.fleet(read_only=check) as fleet:
        results = fleet.map(one)
    if app.json:
        render.emit_json(render.results_json(results, lambda value: value))
    else:
        done = "would remove" if check else "removed"
        for name, res in results.items():
            if res.ok and res.value is not None:
                bases = "".join(f"; base venv {b} (no release {'would use it then' if check else 'uses it now'})"
                                for b in res.value["bases_removed"])
                render.console().print(render.cell(f"{name}: {done} {res.value['removed']}{bases}"))
        render.print_failures(results)
        render.console().print(render.summary_line(results))
    return exit_code_for(results)


@click.command()
@click.argument("instance", required=False)
@click.option("-n", "--lines", type=click.IntRange(1, 10000), default=50, show_default=True,
              help="How many of the last lines.")
@click.option("--since", metavar="TIME", help="Only lines since TIME (journalctl's --since; systemd hosts).")
@click.option("-f", "--follow", is_flag=True, help="Then print new lines as they arrive, each prefixed by its host "
              "(and instance), until Ctrl-C. (The global -f, given before the command, is --forks.)")
@host_options
@click.pass_obj
def logs(app: AppContext, instance: str | None, lines: int, since: str | None, follow: bool) -> int:
    """The inference server's last log lines on every host (INSTANCE: only that server of a release with
    instances); identical lines gathered (like shell)."""
    from fleetctl import adhoc
    from fleetctl.release.logs import service_logs

    if follow:
        return follow_logs(app, instance, lines, since)
    with app.fleet(read_only=True) as fleet:
        results = fleet.map(lambda ctx: service_logs(ctx, lines, since, instance))
    if app.json:
        render.emit_json(render.results_json(results, lambda r: {"source": r.command, "lines": r.stdout.splitlines()}))
    else:
        render.print_blocks(adhoc.gather(results))
        render.console().print(render.summary_line(results))
    return exit_code_for(results)


def follow_logs(app: AppContext, instance: str | None, lines: int, since: str | None) -> int:
    """``logs --follow``: one line per log line as it arrives (``--json``: one JSON document per line);
    a host whose stream ended gets one line on stderr. Ctrl-C: 130; every stream ended: 0, or 2 when
    some host was lost or could not follow."""
    import json
    from contextlib import closing

    from fleetctl.release.log_follow import follow

    failed, ended = False, 0
    try:
        with app.fleet() as fleet, closing(follow(fleet, lines, since, instance)) as events:
            for ev in events:  # the followers' channels live on this fleet's own connections
                failed |= ev.lost
                ended += ev.kind == "ended"
                who = f"{ev.host}{' ' + ev.instance if ev.instance else ''}"
                if app.json:
                    click.echo(json.dumps({"host": ev.host, "instance": ev.instance, ev.kind: ev.text,
                                           **({"lost": ev.lost} if ev.kind == "ended" else {})}))
                elif ev.kind == "line":
                    click.echo(f"{who}: {ev.text}")
                else:
                    others = " (following the others)" if ev.kind == "ended" and ended < len(fleet.contexts) else ""
                    click.echo(f"fleetctl: {who}: {ev.text}{others}", err=True)
    except KeyboardInterrupt:
        return 130
    return 2 if failed else 0
