"""``fleetctl probe ...``: ask every host what its installed software really contains."""

from __future__ import annotations

import click

from fleetctl.cli.probe_runtime import http, import_, script
from fleetctl.cli.probe_source import grep, symbol


@click.group()
def probe() -> None:
    """Search source, find symbols, import modules, hit health endpoints, run your own script."""


for _command in (grep, symbol, import_, http, script):
    probe.add_command(_command)
