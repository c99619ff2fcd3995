"""``fleetctl drift``: are these hosts running the same thing?"""

from __future__ import annotations

from pathlib import Path

import click

from fleetctl.cli import complete
from fleetctl.cli.context import AppContext
from fleetctl.cli.options import host_options, venv_option
from fleetctl.errors import ExitCode


@click.command()
@venv_option
@click.option("--baseline", "baseline_host", metavar="HOST", shell_complete=complete.host_names,
              help="Compare against this host.")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Compare against a lock file (pip freeze output or name==version pins).")
@click.option("--packages", "packages", multiple=True, metavar="GLOB", help="Only these packages (repeatable).")
@click.option("--verify-files", is_flag=True, help="Check every installed file against its RECORD hash.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown", "html"]), default=None,
              help="Output format (default: table; --json means json).")
@click.option("--output", "output", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here.")
@click.option("--all", "show_all", is_flag=True, help="Show every package row, not only those that differ.")
@click.option("--skip", "skip", multiple=True, metavar="CLASS",
              type=click.Choice(["unsatisfied", "extra", "orphan-file", "stack", "foreign-shebang"]),
              help="Leave a finding class out (e.g. unsatisfied for venvs installed with --no-deps).")
@host_options
@click.pass_obj
def drift(app: AppContext, venv: str | None, baseline_host: str | None, lock_file: Path | None,
          packages: tuple[str, ...], verify_files: bool, fmt: str | None, output: Path | None, show_all: bool,
          skip: tuple[str, ...]) -> int:
    """Find what differs between hosts' venvs, and files changed under pip's feet.

    Exit 0: no drift; 1: drift found; 2: some hosts failed or were unreachable.
    """
    from fleetctl.drift import audit as core
    from fleetctl.drift import report as drift_report
    from fleetctl.lockfile import parse_lock

    if baseline_host and lock_file:
        raise click.UsageError("--baseline and --lock are exclusive: pick one baseline")
    lock = (parse_lock(lock_file), str(lock_file)) if lock_file else None
    core.require_a_venv(app.selected_hosts(), venv)
    with app.fleet(read_only=True, in_venv=venv or True) as fleet:
        results = fleet.map(lambda ctx: core.collect(ctx, venv, verify_files))
    report = core.audit(results, baseline_host=baseline_host, lock=lock, packages=packages, skip=skip)
    drift_report.emit(report, fmt or ("json" if app.json else "table"), output, show_all)
    if report.failed:
        return int(ExitCode.HOST_FAILED)
    return int(ExitCode.BAD_ANSWER if report.drifting_hosts else ExitCode.OK)
