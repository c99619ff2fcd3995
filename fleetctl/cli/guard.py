"""Commands that change hosts ask before they do: ``deploy``, ``rollback``,
``service start|stop|restart``, ``releases remove`` and ``shell``.

- They need an explicit target, ``-l PATTERN`` (``-l all`` for every host): without one they refuse
  in one line, exit 3, before the inventory's hosts are contacted. Ansible's ad-hoc ``ansible``
  requires a pattern for the same reason; a release spec has no ``hosts:`` key (it says what a host
  serves, not where), and no environment variable or config key names a target.
- On a terminal (stdin and stdout both a tty) they show the plan (hosts, what, batches) and ask;
  ``--yes``/``-y`` does not ask. Without a terminal the explicit target is the consent, so scripts
  and CI keep working.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from fleetctl.cli.context import AppContext
from fleetctl.errors import ExitCode, FleetError, InputError


class NotConfirmed(FleetError):
    exit_code = ExitCode.BAD_ANSWER


def _set_yes(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        app = ctx.find_object(AppContext)
        assert app is not None, "the fleetctl group sets ctx.obj"
        app.assume_yes = True


yes_option = click.option("-y", "--yes", is_flag=True, expose_value=False, callback=_set_yes,
                          help="Do not ask before changing the hosts (on a terminal it shows the plan and asks; "
                               "without one, -l is enough).")


def approve(app: AppContext, command: str, what: str, serial: Sequence[int | str] = (),
            group_var: str | None = None) -> None:
    """Refuse without a target; on a terminal show the plan and ask. Before any host is contacted."""
    if app.limit is None:
        raise InputError(f"{command} changes hosts: name them with -l PATTERN (-l all: every host in the "
                         "inventory); nothing was contacted")
    hosts = app.selected_hosts()
    if app.assume_yes or not (sys.stdin.isatty() and sys.stdout.isatty()) or not hosts:
        return
    for line in plan_lines(app, what, [h.name for h in hosts], serial, group_var):
        click.echo(line, err=True)
    if not click.confirm(f"{command} on {_count(len(hosts))}?", default=False, err=True):
        raise NotConfirmed("not confirmed: nothing was changed")


def plan_lines(app: AppContext, what: str, names: list[str], serial: Sequence[int | str],
               group_var: str | None) -> list[str]:
    from fleetctl.runs.rollout import batches

    variables = {h.name: h.vars for h in app.selected_hosts()}
    group_of: Any = (lambda h: variables[h].get(group_var)) if group_var else None
    plan = batches(sorted(names), list(serial) or None, group_of)
    out = [f"plan: {what}", f"hosts ({len(names)}): {', '.join(sorted(names))}"]
    if len(plan) == 1:
        out.append("batches: 1 (every host at once; --serial N for batches)")
    else:
        out += [f"batches: {len(plan)}"] + [f"  batch {i}: {', '.join(b)}" for i, b in enumerate(plan, 1)]
    return out


def _count(n: int) -> str:
    return f"{n} host" + ("" if n == 1 else "s")
