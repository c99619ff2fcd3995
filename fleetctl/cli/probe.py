"""``fleetctl probe ...``: ask every host what its installed software really contains."""

from __future__ import annotations

from typing import Any

import click

from fleetctl import render
from fleetctl.cli.options import exit_code_for
from fleetctl.errors import ExitCode
from fleetctl.probes import Expect, check_expectation
from fleetctl.transport.base import HostResult

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


@click.group()
def probe() -> None:
    """Search source, find symbols, import modules, hit health endpoints, run your own script."""


def _register() -> None:
    from fleetctl.cli.probe_runtime import http, import_, script
    from fleetctl.cli.probe_source import grep, symbol

    for command in (grep, symbol, import_, http, script):
        probe.add_command(command)


_register()
