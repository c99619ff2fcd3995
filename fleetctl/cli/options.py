"""Options and parsing shared by several commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import yaml

from fleetctl import render
from fleetctl.cli import complete
from fleetctl.cli.context import AppContext
from fleetctl.errors import ExitCode
from fleetctl.probes import Expect, check_expectation
from fleetctl.transport.base import HostResult


def parse_extra_vars(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any]:
    """``-e``, as ``ansible-playbook`` parses it (``extra_vars_of``)."""
    return extra_vars_of(values)


def extra_vars_of(values: tuple[str, ...]) -> dict[str, Any]:
    """Ansible's ``-e``: ``@FILE`` a YAML/JSON mapping; ``{...}`` a JSON/YAML mapping (typed);
    else ``k=v k2='a b'`` pairs, split as a shell would, every value a string (``v=1.10`` is
    "1.10", ``o=0755`` is "0755"). Later ones win."""
    out: dict[str, Any] = {}
    for item in values:
        if item.startswith("@"):
            path = Path(item[1:]).expanduser()
            try:
                data = yaml.safe_load(path.read_text())
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
                raise click.BadParameter(f"-e {item}: {exc}") from None
            out.update(_mapping(data, f"-e {item}"))
        elif item.lstrip()[:1] in ("{", "["):
            try:
                data = yaml.safe_load(item)
            except yaml.YAMLError as exc:
                raise click.BadParameter(f"-e {item!r}: not JSON/YAML: {str(exc).splitlines()[0]}") from None
            out.update(_mapping(data, f"-e {item!r}"))
        else:
            out.update(_key_values(item))
    return out


def _mapping(data: Any, what: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise click.BadParameter(f"{what}: expected a mapping of variables")
    return {str(k): v for k, v in data.items()}


def _key_values(item: str) -> dict[str, str]:
    import shlex

    try:
        words = shlex.split(item)
    except ValueError as exc:
        raise click.BadParameter(f"-e {item!r}: {exc}") from None
    out: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"-e {item!r}: {word!r} is not KEY=VALUE (or give JSON, or @FILE)")
        out[key.strip()] = value
    return out


def exit_code_for(results: dict[str, HostResult[Any]]) -> int:
    """0 when every host is ok, 2 when any host failed or was unreachable."""
    return int(ExitCode.OK if all(r.ok for r in results.values()) else ExitCode.HOST_FAILED)


venv_option = click.option("--venv", metavar="PATH", help="The venv to inspect (default: each host's `venv` var).")


def _set_limit(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        _app(ctx).limit = value


def _set_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        _app(ctx).json = True


def _app(ctx: click.Context) -> AppContext:
    app = ctx.find_object(AppContext)
    assert app is not None, "the fleetctl group sets ctx.obj"
    return app


def host_options(fn: Any) -> Any:
    """``-l`` and ``--json`` accepted after the command too (``fleetctl hosts -l gpu --json``)."""
    fn = click.option("-l", "--limit", metavar="PATTERN", expose_value=False, callback=_set_limit,
                      shell_complete=complete.host_patterns, help="Host pattern (overrides the global -l).")(fn)
    fn = click.option("--json", is_flag=True, expose_value=False, callback=_set_json,
                      help="Print one JSON document.")(fn)
    return fn


expect_option = click.option(
    "--expect", type=click.Choice([e.value for e in Expect]), default=None,
    help="Exit 1 when the answer is not this on some host, naming those hosts (health gates use this).",
)


def finish(results: dict[str, HostResult[Any]], expect: str | None, found: Any, what: str) -> int:
    """Exit code for a probe: 2 if hosts failed, else 1 if ``--expect`` failed somewhere, else 0.

    Prints the expectation's verdict on stderr when one was asked for.
    """
    code = exit_code_for(results)
    if expect is None:
        return code
    report = check_expectation(results, found, Expect(expect))
    render.console(stderr=True).print(report.message(what), markup=False)
    if code == ExitCode.OK and not report.ok:
        return int(ExitCode.BAD_ANSWER)
    return code


def _serial_steps(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[int | str, ...]:
    from fleetctl.playbook.play_schema import _check_step

    steps: list[int | str] = []
    for value in values:
        for part in value.split(","):
            try:
                steps.append(_check_step(part.strip()))
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
    return tuple(steps)


def rollout_options(fn: Any) -> Any:
    """``--serial`` and the failure budgets, as a play's ``serial``, ``max_fail_percentage``,
    ``max_failures`` and ``serial_group_var`` (one planner: ``runs/rollout.py``); passed as ``rollout``."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, serial: tuple[int | str, ...], max_fail_percentage: float | None,
                max_failures: int | None, group_by: str | None, **kwargs: Any) -> Any:
        from fleetctl.release.batched import Rollout
        from fleetctl.runs.rollout import Budget

        how = Rollout(serial, Budget(max_fail_percentage, max_failures), group_by)
        return fn(*args, rollout=how, **kwargs)

    wrapper = click.option("--serial", multiple=True, metavar="N|P%", callback=_serial_steps,
                           help="Hosts per batch, a count or a percentage; repeatable or comma-separated "
                                "(1,50%: a canary, then half); the last step repeats.")(wrapper)
    wrapper = click.option("--max-fail-percentage", type=click.FloatRange(0, 100), default=None,
                           help="Stop when more than this share of a batch failed.")(wrapper)
    wrapper = click.option("--max-failures", type=click.IntRange(0), default=None,
                           help="Stop when more than this many hosts failed in all.")(wrapper)
    wrapper = click.option("--group-by", metavar="VAR", default=None,
                           help="A host variable naming each host's multi-node group: a batch never splits one.")(
        wrapper)
    return wrapper
