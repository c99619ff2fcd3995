"""`fleetctl lab up|status|down`: a fleet of real SSH hosts on this machine, for tests and demos."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from fleetctl.errors import ExitCode

if TYPE_CHECKING:
    from fleetctl.lab import LabHostStatus

F = TypeVar("F", bound=Callable[..., Any])


def _default_dir() -> Path:
    from fleetctl.lab.state import default_lab_dir

    return default_lab_dir()


def _dir_option(func: F) -> F:
    option = click.option(
        "--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=_default_dir,
        show_default=".fleetctl/lab, or /var/tmp/fleetctl-*/lab when this folder is under /root",
        help="Folder holding the lab's keys, inventory and per-host files.",
    )
    return option(func)


def _table(statuses: Sequence[LabHostStatus]) -> str:
    rows = [("HOST", "ADDRESS", "PID", "STATE", "WHY")]
    rows += [(s.name, s.address, str(s.pid or "-"), s.state, s.why) for s in statuses]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    )


@click.group(name="lab", hidden=True)  # a test and demo harness (root only), not an operator's command
def lab() -> None:
    """Run N real OpenSSH hosts (lab1..labN) on this machine, each in its own namespaces."""


@lab.command("up")
@click.option("--hosts", "-n", "hosts", type=click.IntRange(min=1), default=4, show_default=True,
              help="How many hosts (lab1..labN).")
@_dir_option
@click.option("--base-address", default="127.0.1.0", show_default=True,
              help="Host N listens on the N-th address after this one (.0 and .255 skipped; "
                   "inside 127.0.0.0/8), port 22.")
@click.option("--systemd-host", "systemd_hosts", multiple=True, metavar="NAME",
              help="Boot this host under a real systemd (its init from now on; repeatable).")
def up(hosts: int, directory: Path, base_address: str, systemd_hosts: tuple[str, ...]) -> None:
    """Start the lab (idempotent); the last line printed is the inventory path."""
    from fleetctl.lab import lab_up  # the lab code loads only for lab commands
    from fleetctl.lab.accounts import LAB_USER
    from fleetctl.lab.fleet import set_init

    for name in systemd_hosts:
        set_init(directory, name, hosts=hosts)
    fleet = lab_up(hosts, directory, base_address)
    click.echo(_table(fleet.hosts))
    kept = len(fleet.hosts) - len(fleet.started)
    click.echo(f"{len(fleet.started)} started, {kept} already up, in {fleet.elapsed_s:.2f}s; "
               f"client key {fleet.key_path}, host keys pinned in {fleet.known_hosts_path}")
    click.echo(f"each host also has the user {LAB_USER} (passwordless sudo, same client key); "
               "the inventory logs in as root")
    click.echo(str(fleet.inventory_path))


@lab.command("status")
@_dir_option
@click.pass_context
def status(ctx: click.Context, directory: Path) -> None:
    """Show each host: up (our sshd answers on its address) or down, with why."""
    from fleetctl.lab import lab_status

    statuses = lab_status(directory)
    if not statuses:
        click.echo(f"no lab in {directory}")
        ctx.exit(ExitCode.BAD_ANSWER)
    click.echo(_table(statuses))
    if any(s.state != "up" for s in statuses):
        ctx.exit(ExitCode.BAD_ANSWER)


@lab.command("down")
@_dir_option
@click.option("--purge", is_flag=True, help="Also delete the folder (keys, inventory, host files).")
def down(directory: Path, purge: bool) -> None:
    """Stop exactly the sshd processes this lab started; keep the folder unless --purge."""
    from fleetctl.lab import lab_down

    statuses = lab_down(directory, purge=purge)
    if statuses:
        click.echo(_table(statuses))
    else:
        click.echo(f"no lab in {directory}")
    if purge:
        click.echo(f"removed {directory}")


@lab.command("links")
@_dir_option
@click.option("--rate", metavar="RATE", help="Every host's upload and download cap (50M = 50 MB/s; tc).")
@click.option("--delay", "delay_ms", type=click.FloatRange(0, 60000), metavar="MS",
              help="Hold each chunk to or from the host's ssh port MS each way (a relay; 0: none).")
@click.option("--loss", "loss_pct", type=click.FloatRange(0, 100), metavar="PCT",
              help="Drop this share of the host's packets each way (0: none).")
@click.option("--partition/--heal", default=None, help="Drop every packet to and from the host (or stop).")
@click.option("--host", "hosts", multiple=True, metavar="NAME",
              help="The host(s) --delay, --loss, --partition and --off apply to (repeatable; default: all).")
@click.option("--off", "--clear", "off", is_flag=True, help="Remove the lab's shaping and faults.")
def links(directory: Path, rate: str | None, delay_ms: float | None, loss_pct: float | None,
          partition: bool | None, hosts: tuple[str, ...], off: bool) -> None:
    """Give lab hosts links: a rate each way (tc on loopback), latency, loss or a partition
    (nf_tables rules of the lab's own table); each call changes only what it names."""
    from fleetctl.cli.models_sync import parse_rate
    from fleetctl.lab import lab_status, netfaults
    from fleetctl.lab import links as core

    addresses = {s.name: s.address for s in lab_status(directory)}
    if not addresses:
        raise click.UsageError(f"no lab in {directory}")
    unknown = [h for h in hosts if h not in addresses]
    if unknown:
        raise click.UsageError(f"no lab host {unknown[0]} in {directory} (hosts: {', '.join(addresses)})")
    if rate and hosts:
        raise click.UsageError("--rate applies to every lab host; --host picks those of --delay, --loss, --partition")
    names = list(hosts) or list(addresses)
    if off or (rate is None and delay_ms is None and loss_pct is None and partition is None):
        if not hosts:
            core.unshape(directory, addresses)
            netfaults.clear(directory)
            click.echo(f"links of {len(addresses)} lab hosts: unshaped, no faults")
            return
        netfaults.set_faults(directory, addresses, {h: netfaults.Fault() for h in names})
        click.echo(f"links of {', '.join(names)}: no faults")
        return
    if rate:
        core.shape(directory, addresses, core.LinkSpec(parse_rate(rate)))
        click.echo(f"links of {len(addresses)} lab hosts: {rate} each way")
    if delay_ms is not None or loss_pct is not None or partition is not None:
        _set_faults(directory, addresses, names, delay_ms, loss_pct, partition)


def _set_faults(directory: Path, addresses: dict[str, str], names: list[str], delay_ms: float | None,
                loss_pct: float | None, partition: bool | None) -> None:
    """The named hosts' faults, with what was not given kept from before."""
    from fleetctl.lab import netfaults

    before = netfaults.load(directory)
    faults = {}
    for name in names:
        old = before[name].fault if name in before else netfaults.Fault()
        faults[name] = netfaults.Fault(old.delay_ms if delay_ms is None else delay_ms,
                                       old.loss_pct if loss_pct is None else loss_pct,
                                       old.partition if partition is None else partition)
    netfaults.set_faults(directory, addresses, faults)
    for name in names:
        fault = faults[name]
        said = [f"{fault.delay_ms:g} ms delay each way"] * bool(fault.delay_ms)
        said += [f"{fault.loss_pct:g}% loss each way"] * bool(fault.loss_pct)
        said += ["partitioned (every packet dropped)"] * fault.partition
        click.echo(f"link of {name}: {', '.join(said) or 'no faults'}")
