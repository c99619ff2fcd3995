"""``fleetctl gpu health``: per host and GPU, each health check green / amber / red with its value."""

from __future__ import annotations

import click

from fleetctl import render
from fleetctl.cli.context import AppContext
from fleetctl.cli.options import host_options


@click.group()
def gpu() -> None:
    """GPU health: the facts an operator drains a host for."""


@gpu.command()
@click.option("--problems", is_flag=True, help="Show only the amber and red checks (every host keeps its summary).")
@host_options
@click.pass_obj
def health(app: AppContext, problems: bool) -> int:
    """ECC, row remapping, retired pages, slowdown, power cap, temperature, PCIe and NVLink links, Xids
    in the kernel log, GPU count and model (host vars gpus_expected, gpu_model; thresholds gpu_*).

    Exit 0: every host green or amber; 1: some host is red; 2: some hosts failed or were unreachable.
    """
    from fleetctl.gpu import report as core

    request = core.HealthRequest.for_hosts(app.selected_hosts(), problems)
    with app.fleet(read_only=True) as fleet:
        results = core.run(fleet, request)
    if app.json:
        render.emit_json(core.to_json(results))
    else:
        render.print_gpu_health(results, core.rows(results, request.problems_only))
    return core.exit_code(results)
