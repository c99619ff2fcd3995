"""``fleetctl gpu health``: per host and GPU, each health check green / amber / red with its value."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fleetctl import render
from fleetctl.cli.context import AppContext
from fleetctl.cli.options import host_options

if TYPE_CHECKING:
    from fleetctl.gpu.health import HostHealth
    from fleetctl.transport.base import HostResult


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
        render.emit_json(_health_json(results))
    else:
        render.print_gpu_health(results, core.rows(results, request.problems_only))
    return core.exit_code(results)


def _health_json(results: dict[str, HostResult[HostHealth]]) -> dict[str, Any]:
    from fleetctl.gpu.health import Level
    from fleetctl.gpu.report import red_hosts

    doc = render.results_json(results, lambda h: h.to_dict())
    doc["red_hosts"] = red_hosts(results)
    doc["amber_hosts"] = sorted(h for h, r in results.items() if r.value is not None and r.value.level is Level.AMBER)
    return doc
