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

from fleetctl import __version__
from fleetctl.cli import options
from fleetctl.cli.context import AppContext
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
    "service": "fleetctl.cli.service:service",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, _, attr = COMMANDS[cmd_name].partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"auto_envvar_prefix": "FLEETCTL", "help_option_names": ["-h", "--help"]})
@click.option("-i", "--inventory", "inventory_paths", multiple=True, metavar="PATH",
              help="Inventory source, repeatable: an Ansible YAML or INI file, a directory of them, an executable "
                   "inventory script, or 'host1,host2,'. Env: FLEETCTL_INVENTORY (a ',' or ':' list).")
@click.option("-l", "--limit", metavar="PATTERN", help="Host pattern, as Ansible: 'gpu:!ct129', '~ct1[0-9]+'.")
@click.option("-f", "--forks", type=click.IntRange(1, 1024), default=32, show_default=True,
              help="Hosts worked on in parallel.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
@click.option("-e", "--extra-vars", "extra_vars", multiple=True, metavar="KEY=VALUE|@FILE",
              callback=options.parse_extra_vars, help="Variables that override the inventory's.")
@click.option("-T", "--timeout", type=click.FloatRange(min=0.1), default=600.0, show_default=True,
              help="Per-command timeout in seconds.")
@click.option("--persist", type=click.FloatRange(min=0), default=0.0, metavar="SECONDS", envvar="FLEETCTL_PERSIST",
              help="Keep SSH connections and agents this long after a read-only command (ping, facts, probe, "
                   "drift, status, releases, gpu health, report) for the next ones, like ControlPersist; 0: off. "
                   "Env: FLEETCTL_PERSIST.")
@click.option("-u", "--user", metavar="USER", help="Log in as USER where the inventory sets no ansible_user "
              "(else ssh_config's User, else your local user).")
@click.option("--private-key", metavar="FILE", type=click.Path(dir_okay=False),
              help="Key file where the inventory sets no ansible_ssh_private_key_file.")
@click.option("-b", "--become", is_flag=True, help="Run as --become-user (root) through sudo where the inventory "
              "sets no ansible_become.")
@click.option("--become-user", metavar="USER", help="The user to become (default root).")
@click.option("-K", "--ask-become-pass", is_flag=True, help="Ask for the sudo password once, before connecting.")
@click.option("--vault-password-file", "vault_password_files", multiple=True, metavar="FILE",
              help="Vault password file (label 'default'); an executable one is run and its output used.")
@click.option("--vault-id", "vault_ids", multiple=True, metavar="LABEL@FILE",
              help="Vault password with its vault-id label (LABEL@prompt asks), repeatable.")
@click.option("--ask-vault-pass", "--ask-vault-password", is_flag=True, help="Ask for the vault password once.")
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv for debug).")
@click.version_option(__version__, prog_name="fleetctl")
@click.pass_context
def cli(ctx: click.Context, inventory_paths: tuple[str, ...], limit: str | None, forks: int, as_json: bool,
        extra_vars: dict[str, object], timeout: float, persist: float, user: str | None, private_key: str | None,
        become: bool, become_user: str | None, ask_become_pass: bool, vault_password_files: tuple[str, ...],
        vault_ids: tuple[str, ...], ask_vault_pass: bool, verbose: int) -> None:
    """Run a fleet of GPU inference hosts: facts, probes, drift audits, venvs, releases."""
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if verbose < 2:
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    connect = options.connect_options(user, private_key, become, become_user, ask_become_pass)
    if not inventory_paths and os.environ.get("FLEETCTL_INVENTORY"):
        from fleetctl.inventory.sources import env_sources

        inventory_paths = tuple(env_sources(os.environ["FLEETCTL_INVENTORY"]))
    vault = options.vault_options(vault_password_files, vault_ids, ask_vault_pass)
    ctx.obj = AppContext(inventory_paths, limit, forks, as_json, verbose, dict(extra_vars), timeout, persist,
                         connect, vault)


def _crash_log() -> Path:
    folder = Path(os.environ.get("FLEETCTL_LOG_DIR", "~/.cache/fleetctl")).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    path.write_text(traceback.format_exc())
    return path


def main(argv: list[str] | None = None) -> int:
    """Entry point: every expected error is one line on stderr; the exit code says what happened."""
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
