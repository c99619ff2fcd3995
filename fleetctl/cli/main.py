"""The ``fleetctl`` group: global options, and errors turned into one line and an exit code."""

from __future__ import annotations

import atexit
import gc
import importlib
import logging
import os
import sys
import time
import traceback
from pathlib import Path

import click

from fleetctl import __version__, redact
from fleetctl.cli import global_options
from fleetctl.cli.context import AppContext, LoginOptions
from fleetctl.errors import ExitCode, FleetError

# The process ends without the interpreter's last garbage collection over everything the command
# built (60 ms of CPU for a 200-host inventory, a sixth of a kept-connection ping): at exit nothing
# waits on it (files are closed as their last reference goes; cycles are not finalized either way).
atexit.register(gc.freeze)

# Each command's module is imported when that command runs (click's lazy-loading pattern): a
# command pays only for its own imports, which is most of a short command's time.
COMMANDS = {
    "hosts": "fleetctl.cli.hosts:hosts", "ping": "fleetctl.cli.adhoc:ping", "shell": "fleetctl.cli.adhoc:shell",
    "facts": "fleetctl.cli.adhoc:facts", "probe": "fleetctl.cli.probe:probe", "drift": "fleetctl.cli.drift:drift",
    "venv": "fleetctl.cli.venv:venv", "deploy": "fleetctl.cli.release:deploy",
    "rollback": "fleetctl.cli.release:rollback", "status": "fleetctl.cli.release:status",
    "releases": "fleetctl.cli.release:releases", "run": "fleetctl.cli.run:run", "runs": "fleetctl.cli.run:runs",
    "kernels": "fleetctl.cli.kernels:kernels", "connections": "fleetctl.cli.connections:connections",
    "lab": "fleetctl.cli.lab:lab", "gpu": "fleetctl.cli.gpu:gpu",
    "vault": "fleetctl.cli.vault:vault", "report": "fleetctl.cli.report:report", "logs": "fleetctl.cli.release:logs",
    "service": "fleetctl.cli.service:service", "models": "fleetctl.cli.models:models",
    "router": "fleetctl.cli.router:router",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            command = super().get_command(ctx, cmd_name)
        else:
            module, _, attr = COMMANDS[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attr)
            assert isinstance(command, click.Command)
        if command is not None:
            global_options.attach(command)
            whole_summaries(command)
        return command


def whole_summaries(command: click.Command) -> None:
    """Each command's summary in a listing is its help's whole first sentence, wrapped, never cut
    with "..." (click cuts it at 45 characters unless short_help is set)."""
    if command.short_help is None and command.help:
        command.short_help = command.get_short_help_str(limit=10_000)
    for sub in getattr(command, "commands", {}).values():
        whole_summaries(sub)


EXAMPLES = """Examples:

\b
  fleetctl -i inv.yml hosts                  # hosts, groups, how each is reached
  fleetctl -i inv.yml -l gpu ping            # every host of the group gpu
  fleetctl -i inv.yml drift --venv /opt/env  # what differs between the venvs
  fleetctl -i inv.yml -l canary deploy release.yml
  fleetctl -i inv.yml run deploy.yml --check --diff

Shell completion (hosts, groups, release ids, run ids), in ~/.bashrc:
eval "$(_FLEETCTL_COMPLETE=bash_source fleetctl)" (zsh_source, fish_source for those shells)."""


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=f"{EXAMPLES}\n\n{global_options.ENV_HELP}\n\n{global_options.CONFIG_HELP}")
@global_options.group_options
@click.version_option(__version__, prog_name="fleetctl")
@click.pass_context
def cli(ctx: click.Context, inventory_paths: tuple[str, ...], limit: str | None, forks: int | None, as_json: bool,
        extra_vars: dict[str, object], timeout: float, persist: float, user: str | None, private_key: str | None,
        become: bool, become_user: str | None, ask_become_pass: bool, vault_password_files: tuple[str, ...],
        vault_ids: tuple[str, ...], ask_vault_pass: bool, verbose: int, assume_yes: bool) -> None:
    """Run a fleet of GPU inference hosts: facts, probes, drift audits, venvs, releases.

    Global options (the ones below) go before the command: fleetctl -i INV -l gpu ping. They are
    accepted after it too (fleetctl ping -i INV), except where the command has a flag of its own of
    that name (probe grep -i, logs -f): its --help says so; give those before the command.
    Commands that change hosts (deploy, rollback, service start|stop|restart, releases remove, shell)
    need a target, -l PATTERN or -l all, and on a terminal ask before they start (--yes: don't ask).
    """
    from fleetctl.config import find_config, load_config

    redact.REGISTRY.clear()  # this command's secrets only (a test runs many commands in one process)
    if not isinstance(sys.stdout, redact.RedactingStream):  # called without main() (click's CliRunner)
        ctx.call_on_close(redact.install())
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    redact.filter_log_handlers()
    global_options.set_logging(verbose)
    config = load_config(find_config())
    if config.warning():
        click.echo(f"fleetctl: warning: {config.warning()}", err=True)
    login = LoginOptions(user, private_key, become, become_user, ask_become_pass, vault_password_files, vault_ids,
                         ask_vault_pass)
    ctx.obj = AppContext(inventory_paths, limit, forks or config.forks() or 32, as_json, verbose, dict(extra_vars),
                         timeout, persist, login, config, assume_yes=assume_yes)


def _crash_log() -> Path:
    folder = Path(os.environ.get("FLEETCTL_LOG_DIR", "~/.cache/fleetctl")).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    path.write_text(redact.redact(traceback.format_exc()))
    return path


def main(argv: list[str] | None = None) -> int:
    """Entry point: every expected error is one line on stderr; the exit code says what happened.
    Everything it writes goes through the redaction layer (``fleetctl/redact.py``)."""
    restore = redact.install()
    try:
        return _main(argv)
    finally:
        restore()


def _main(argv: list[str] | None) -> int:
    try:
        rv = cli.main(args=argv, prog_name="fleetctl", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:  # usage errors are input errors: exit 3, not click's 2
        exc.show()
        return int(ExitCode.USAGE)
    except click.Abort:
        click.echo("fleetctl: aborted", err=True)
        return 130
    except FleetError as exc:
        click.echo(f"fleetctl: error: {exc}", err=True)
        return int(exc.exit_code)
    except Exception as exc:
        click.echo(f"fleetctl: internal error: {type(exc).__name__}: {exc} (traceback in {_crash_log()})",
                   err=True)
        return int(ExitCode.INTERNAL)
    return int(rv or 0)


if __name__ == "__main__":
    sys.exit(main())
