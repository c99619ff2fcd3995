"""``fleetctl report``: the fleet at a glance, as one self-contained HTML page or one JSON document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fleetctl import render
from fleetctl.cli import complete
from fleetctl.cli.context import AppContext
from fleetctl.cli.options import host_options, venv_option


@click.command()
@click.option("--output", "output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the HTML page here (one file: no network, no external assets).")
@venv_option
@click.option("--baseline", "baseline_host", metavar="HOST", shell_complete=complete.host_names,
              help="Judge drift against this host.")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Judge drift against a lock file (pip freeze output or name==version pins).")
@click.option("--packages", "packages", multiple=True, metavar="GLOB", help="Only these packages (repeatable).")
@click.option("--skip", "skip", multiple=True, metavar="CLASS",
              type=click.Choice(["unsatisfied", "extra", "orphan-file", "stack", "foreign-shebang"]),
              help="Leave a drift finding class out.")
@click.option("--verify-files", is_flag=True, help="Check every installed file against its RECORD hash.")
@click.option("--all", "show_all", is_flag=True, help="Every package row in the matrix, not only those that differ.")
@click.option("--runs", "runs", type=click.IntRange(0, 100), default=5, show_default=True,
              help="How many of the last rollouts (run journals) to show.")
@host_options
@click.pass_obj
def report(app: AppContext, output: Path | None, venv: str | None, baseline_host: str | None,
           lock_file: Path | None, packages: tuple[str, ...], skip: tuple[str, ...], verify_files: bool,
           show_all: bool, runs: int) -> int:
    """One read-only pass over the selected hosts: release, service and health, drift, GPU health,
    the last run that touched each host; the last rollouts; each host's release switches.

    Exit 0: no host red; 1: some host is red; 2: some hosts failed or were unreachable.
    """
    from fleetctl.lockfile import parse_lock
    from fleetctl.report import fleet as core
    from fleetctl.report.data import ReportRequest, gather
    from fleetctl.runs.journal import runs_dir

    if baseline_host and lock_file:
        raise click.UsageError("--baseline and --lock are exclusive: pick one baseline")
    request = ReportRequest.for_hosts(
        app.selected_hosts(), runs_dir(app.inventory.folder), venv=venv, baseline_host=baseline_host,
        lock=(parse_lock(lock_file), str(lock_file)) if lock_file else None, packages=packages, skip=skip,
        verify_files=verify_files, show_all=show_all, runs=runs,
        split_groups=tuple(g.name for g in app.inventory.groups.values()
                           if not g.children and g.name not in ("all", "ungrouped")))
    with app.fleet(read_only=True) as fleet:
        doc = core.build(gather(fleet, request))
    if output is not None:
        render.write_atomic(output, core.to_html(doc))
    if app.json:
        render.emit_json(doc)
        if output is not None:
            render.console(stderr=True).print(render.cell(f"report written to {output}"))
    else:
        print_summary(doc, output)
    return core.exit_code(doc)


def print_summary(doc: dict[str, Any], output: Path | None) -> None:
    """The hosts that are not OK, one line each, then the summary and where the page is."""
    out = render.console()
    for row in doc["hosts"]:
        if row["level"] in ("red", "amber"):
            out.print(render.cell(f"{row['host']}: {row['level'].upper()}: " + "; ".join(row["problems"])))
    for note in doc["notes"]:
        out.print(render.cell(note))
    out.print(render.cell(doc["summary"]["line"]), style="bold")
    out.print(render.cell(f"report written to {output}" if output else "--output FILE writes the page"))
