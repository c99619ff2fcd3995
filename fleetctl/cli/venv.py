"""``fleetctl venv create`` and ``fleetctl venv overlay``: build venvs the way an installer would."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fleetctl import render
from fleetctl.cli import complete
from fleetctl.cli.context import AppContext
from fleetctl.cli.options import exit_code_for, host_options
from fleetctl.errors import InputError

if TYPE_CHECKING:
    from fleetctl.overlay.run import OverlayReport
    from fleetctl.transport.base import HostResult
    from fleetctl.venv_create import CreateOutcome


@click.group()
def venv() -> None:
    """Create venvs from pins, or overlay distributions from another host's venv."""


@venv.command()
@click.option("--venv", "path", required=True, metavar="PATH", help="Where the venv lives on each host.")
@click.option("--python", "python", metavar="VERSION", help="Use python3.X on the host (e.g. 3.11).")
@click.option("--requirements", "requirements", type=click.Path(dir_okay=False, path_type=Path),
              help="A requirements file, installed with its dependencies.")
@click.option("--lock", "lock", type=click.Path(dir_okay=False, path_type=Path),
              help="name==version pins: installed exactly (extras removed), with no dependency resolution.")
@click.option("--wheelhouse", type=click.Path(file_okay=False, path_type=Path),
              help="A folder of wheels on this machine: uploaded once per host, installed offline.")
@click.option("--no-compile", "no_compile", is_flag=True,
              help="Write no bytecode at install (pip --no-compile; uv writes none unless asked): faster, and "
                   "Python compiles what it imports on first use.")
@click.option("--check", is_flag=True, help="Say per host what would be created, uploaded, installed and removed; "
                                            "change nothing.")
@host_options
@click.pass_obj
def create(app: AppContext, path: str, python: str | None, requirements: Path | None, lock: Path | None,
           wheelhouse: Path | None, no_compile: bool, check: bool) -> int:
    """Create the venv on each host and install exactly the pinned set (uv when the host has it)."""
    from fleetctl import venv_create as core

    if (requirements is None) == (lock is None):
        raise click.UsageError("pass exactly one of --requirements FILE and --lock FILE")
    request = core.load_request(path, python, requirements, lock, wheelhouse, compile_bytecode=not no_compile)
    with app.fleet(read_only=check) as fleet:
        results = core.run_create(fleet, request, check)
    if app.json:
        render.emit_json(render.results_json(results, lambda o: o.to_dict()))
    else:
        _print_create(results)
    return exit_code_for(results)


def _print_create(results: dict[str, HostResult[CreateOutcome]]) -> None:
    rows = []
    for name, res in results.items():
        o = res.value
        rows.append([name, render.status_text(res), o.summary() if o else res.reason, o.installer if o else "",
                     o.python if o else "", f"{o.uploaded} ({o.uploaded_bytes:,} B)" if o else ""])
    out = render.console()
    out.print(render.table(None, ["host", "status", "result", "installer", "python", "uploaded"], rows))
    render.print_failures(results)
    out.print(render.summary_line(results))


@venv.command()
@click.option("--from", "source", required=True, metavar="HOST", shell_complete=complete.host_names,
              help="The host whose venv is copied.")
@click.option("--venv", "path", required=True, metavar="PATH", help="The venv on the source (and targets).")
@click.option("--to-venv", "to_venv", metavar="PATH", help="The venv on the targets, when it lies elsewhere.")
@click.option("--packages", multiple=True, metavar="GLOB", help="Only these distributions (repeatable).")
@click.option("--dry-run", is_flag=True, help="Show the plan, change nothing.")
@click.option("--direct", is_flag=True,
              help="Each target pulls the stream from the source host over its own ssh (it must already trust the "
                   "source's host key; host var direct_ssh_key names its key file), not through this machine.")
@click.option("--compress", "level", type=click.IntRange(0, 9), default=0, show_default=True, metavar="LEVEL",
              help="zlib level of the stream, 1-9 (as ssh -C or rsync -z); for a slow link: on a LAN "
                   "compressing costs more time than it saves.")
@host_options
@click.pass_obj
def overlay(app: AppContext, source: str, path: str, to_venv: str | None, packages: tuple[str, ...], dry_run: bool,
            direct: bool, level: int) -> int:
    """Bring the source venv's distributions into each selected host's venv, as an installer would:
    old versions removed by their RECORD, only differing files sent, paths rewritten."""
    from fleetctl.overlay import run as core
    from fleetctl.transport.fleet import Fleet

    if source not in app.inventory.hosts:
        raise InputError(f"--from {source}: no such host in {app.inventory.path}")
    if direct and app.inventory.hosts[source].connection.kind != "ssh":
        raise InputError(f"--direct: {source} is not reached over ssh, so targets cannot pull from it; "
                         "drop --direct")
    targets = [h for h in app.selected_hosts() if h.name != source]
    if not targets:
        raise InputError(f"no target hosts: the selection holds only the source {source}")
    request = core.OverlayRequest(source, path, to_venv, packages, dry_run, direct, level)
    with app.fleet(source) as src, Fleet(app.inventory, targets, src.settings) as fleet:
        report = core.run_overlay(src.contexts[source], fleet, request)
    if app.json:
        render.emit_json(_overlay_json(report))
    else:
        _print_overlay(report)
    return exit_code_for(report.results)


def _overlay_json(report: OverlayReport) -> dict[str, Any]:
    doc = render.results_json(report.results, lambda v: v.to_dict())
    req = report.request
    return {"source": req.source, "venv": req.venv, "to_venv": req.target_venv, "dry_run": req.dry_run,
            "direct": req.direct, "line": report.summary(), **doc}


def _print_overlay(report: OverlayReport) -> None:
    from fleetctl.overlay.run import outcome_lines, plan_rows

    out = render.console()
    req = report.request
    title = f"overlay plan: {req.source}:{req.venv} -> {req.target_venv}" + (" (dry run)" if req.dry_run else "")
    title += " (direct: each target pulls from the source)" if req.direct else ""
    out.print(render.table(title, ["host", "package", "action", "from", "to", "send", "bytes", "unchanged",
                                   "remove"], plan_rows(report)))
    for line in outcome_lines(report):
        out.print(render.cell(line))
    render.print_failures(report.results)
    out.print(report.summary())
