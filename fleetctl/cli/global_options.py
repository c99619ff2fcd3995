"""The ``fleetctl`` group's options, accepted after the command too, as Ansible users type them
(``fleetctl run -i inv book.yml``, ``fleetctl ping -b``): every command gets a hidden copy of each,
whose value, given after the command, wins over the one given before it (``-i``, ``-e`` and the
vault options add to it). Where a command has an option of its own under the same flag, its own
meaning stays (``probe grep -i`` is --ignore-case, ``logs -f`` is --follow, ``rollback --timeout``
its health wait); the global option is then reached by its other name, and the command's help says so.

Environment variables: only the ones listed in ``ENV_HELP`` (no implicit ``FLEETCTL_<OPTION>``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from fleetctl.cli import complete
from fleetctl.cli.context import AppContext

ENV_HELP = (
    "Environment (no other FLEETCTL_* variable is read): FLEETCTL_INVENTORY (-i), FLEETCTL_PERSIST (--persist), "
    "FLEETCTL_VAULT_PASSWORD_FILE (--vault-password-file), FLEETCTL_CONFIG or ANSIBLE_CONFIG (the config file; "
    "'none': none), FLEETCTL_SSH_CONFIG (another ssh_config, 'none': none), FLEETCTL_LOG_DIR (crash logs), "
    "FLEETCTL_CACHE_DIR (controller caches)."
)
CONFIG_HELP = (
    "Config file: the first of $FLEETCTL_CONFIG, $ANSIBLE_CONFIG, ./fleetctl.cfg, ./ansible.cfg, ~/.fleetctl.cfg, "
    "~/.ansible.cfg; its [defaults] inventory, remote_user, private_key_file, forks, vault_password_file, become, "
    "become_user. Precedence: command line > environment > config file > defaults."
)

# (flags, attribute name, click keyword arguments); help texts are the group's.
SPECS: list[tuple[tuple[str, ...], str, dict[str, Any]]] = [
    (("-i", "--inventory"), "inventory_paths", {"multiple": True, "metavar": "PATH", "help":
        "Inventory source, repeatable: an Ansible YAML or INI file, a directory of them, an executable "
        "inventory script, or 'host1,host2,'. Env: FLEETCTL_INVENTORY (a ',' or ':' list)."}),
    (("-l", "--limit"), "limit", {"metavar": "PATTERN", "help":
        "Host pattern, as Ansible: 'gpu:!ct129', '~ct1[0-9]+', 'all'. Commands that change hosts need one.",
        "shell_complete": complete.host_patterns}),
    (("-f", "--forks"), "forks", {"type": click.IntRange(1, 1024), "default": None,
                                  "help": "Hosts worked on in parallel (default 32, or the config file's forks)."}),
    (("--json",), "as_json", {"is_flag": True, "help": "Print one JSON document instead of tables."}),
    (("-e", "--extra-vars"), "extra_vars", {"multiple": True, "metavar": "KEY=VALUE|JSON|@FILE", "help":
        "Variables that override the inventory's, parsed as Ansible does: 'k=v k2=v2' are strings, "
        "'{\"k\": 1}' a JSON/YAML mapping (typed), @FILE a YAML/JSON file; repeatable, later ones win."}),
    (("-T", "--timeout"), "timeout", {"type": click.FloatRange(min=0.1), "default": 600.0, "show_default": True,
                                      "help": "Per-command timeout in seconds."}),
    (("--persist",), "persist", {"type": click.FloatRange(min=0), "default": 0.0, "metavar": "SECONDS", "help":
        "Keep SSH connections and agents this long after a read-only command (ping, facts, probe, "
        "drift, status, releases, gpu health, report) for the next ones, like ControlPersist; 0: off. "
        "Env: FLEETCTL_PERSIST."}),
    (("-u", "--user"), "user", {"metavar": "USER", "help": "Log in as USER where the inventory sets no "
                                "ansible_user (else ssh_config's User, else your local user)."}),
    (("--private-key",), "private_key", {"metavar": "FILE", "type": click.Path(dir_okay=False),
                                         "help": "Key file where the inventory sets no ansible_ssh_private_key_file."}),
    (("-b", "--become"), "become", {"is_flag": True, "help": "Run as --become-user (root) through sudo where "
                                    "the inventory sets no ansible_become."}),
    (("--become-user",), "become_user", {"metavar": "USER", "help": "The user to become (default root)."}),
    (("-K", "--ask-become-pass"), "ask_become_pass", {"is_flag": True,
                                                      "help": "Ask for the sudo password once, before connecting."}),
    (("--vault-password-file",), "vault_password_files", {"multiple": True, "metavar": "FILE", "help":
        "Vault password file (label 'default'); an executable one is run and its output used. "
        "Env: FLEETCTL_VAULT_PASSWORD_FILE."}),
    (("--vault-id",), "vault_ids", {"multiple": True, "metavar": "LABEL@FILE",
                                    "help": "Vault password with its vault-id label (LABEL@prompt asks), repeatable."}),
    (("--ask-vault-pass", "--ask-vault-password"), "ask_vault_pass", {"is_flag": True,
                                                                      "help": "Ask for the vault password once."}),
    (("-v", "--verbose"), "verbose", {"count": True, "help": "More logging on stderr (-vv for debug)."}),
    (("-y", "--yes"), "assume_yes", {"is_flag": True, "help": "Do not ask before changing hosts (a command "
                                     "that changes hosts asks on a terminal; without one, -l is enough)."}),
]
_LOGIN = {"user", "private_key", "become", "become_user", "ask_become_pass", "vault_password_files", "vault_ids",
          "ask_vault_pass"}


def group_options(fn: Any) -> Any:
    """The options on the ``fleetctl`` group itself."""
    for flags, name, kwargs in reversed(SPECS):
        extra: dict[str, Any] = {"envvar": "FLEETCTL_PERSIST"} if name == "persist" else {}
        if name == "extra_vars":
            from fleetctl.cli.options import parse_extra_vars

            extra["callback"] = parse_extra_vars
        fn = click.option(*flags, name, **kwargs, **extra)(fn)
    return fn


def set_logging(verbose: int) -> None:
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.getLogger().setLevel(level)
    logging.getLogger("paramiko").setLevel(logging.CRITICAL if verbose < 2 else logging.NOTSET)


def attach(command: click.Command) -> None:
    """Give ``command`` (and every command under it) the global options it has no flag of its own for."""
    if getattr(command, "_fleetctl_globals", False):
        return
    command._fleetctl_globals = True  # type: ignore[attr-defined]
    own = {opt for p in command.params for opt in [*p.opts, *p.secondary_opts]}
    shadowed: list[str] = []
    for flags, name, kwargs in SPECS:
        free = [f for f in flags if f not in own]
        if not free:
            continue
        if name != "assume_yes":  # a command's own --yes means the same: nothing to point out
            shadowed += [f"{f} (here: this command's own {f})" for f in flags if f in own]
        settings = {k: v for k, v in kwargs.items() if k not in ("default", "show_default", "help")}
        command.params.append(click.Option([*free, f"global_{name}"], expose_value=False, hidden=True,
                                           callback=_override(name), **settings))
    note = ("The global options (fleetctl --help) are accepted after the command too"
            + (f"; the global {', '.join(shadowed)}, give it before the command." if shadowed else "."))
    command.epilog = f"{command.epilog}\n\n{note}" if command.epilog else note
    for sub in getattr(command, "commands", {}).values():
        attach(sub)


def _override(name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if ctx.get_parameter_source(str(param.name)) is not ParameterSource.COMMANDLINE:
            return
        app = ctx.find_object(AppContext)
        assert app is not None, "the fleetctl group sets ctx.obj"
        apply(app, name, value)

    return callback


def apply(app: AppContext, name: str, value: Any) -> None:
    """One option given after the command: it wins (repeatable ones add to what came before)."""
    if name == "extra_vars":
        from fleetctl.cli.options import extra_vars_of

        app.extra_vars.update(extra_vars_of(value))
    elif name == "inventory_paths":
        app.inventory_paths = (*app.inventory_paths, *value)
    elif name == "as_json":
        app.json = True
    elif name == "verbose":
        app.verbose += value
        set_logging(app.verbose)
    elif name in _LOGIN:
        before = getattr(app.login, name)
        setattr(app.login, name, (*before, *value) if isinstance(before, tuple) else value)
        app.changed_login()
    else:
        setattr(app, name, value)
