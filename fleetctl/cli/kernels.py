"""``kernels plan`` and ``kernels collect``: tuned fused-MoE Triton configs per host, and tuning runs
brought back into the repo."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fleetctl import render
from fleetctl.cli import complete
from fleetctl.cli.context import AppContext
from fleetctl.cli.options import exit_code_for, host_options, venv_option
from fleetctl.errors import ExitCode, InputError
from fleetctl.transport.base import HostResult

if TYPE_CHECKING:
    from fleetctl.kernels import Collected, CollectItem, KernelPlan, TunedSet

DEFAULT_DIR = Path("playbooks/files/kernels")
_LOADS = {"exact": "tuned {loads}", "fallback": "tuned {loads} (FALLBACK: sub-optimal)",
          "shadowed": "built-in {loads} (tuned file NOT used)", "unknown": "? (no triton version)",
          "unused": "none: default config (tuned file NOT used)"}


@click.group()
def kernels() -> None:
    """Tuned fused-MoE Triton configs (SGLang names, in triton_X_Y_Z folders): which apply where."""


@kernels.command()
@venv_option
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
              show_default=True, help="The tuned configs: triton_X_Y_Z/E=..,N=..,device_name=...json.")
@click.option("--strict", is_flag=True, help="Exit 1 when a host has a warning (fallback, no tuned file).")
@host_options
@click.pass_obj
def plan(app: AppContext, venv: str | None, directory: Path, strict: bool) -> int:
    """Per host: GPU name and triton version (host vars gpu_name / triton_version stand in where
    nvidia-smi or triton are absent), the tuned files that apply and what SGLang would load for
    each; warns where it would fall back to another triton folder or find no tuned file."""
    from fleetctl import kernels as core

    tuned = core.load_tuned(directory)
    siblings = core.sibling_names(tuned)  # the built-in texts the up/down check may need
    with app.fleet() as fleet:
        results = fleet.map(lambda ctx: core.plan_host(
            ctx.name, *plan_inputs(ctx, venv or ctx.host.connection.venv, tuned, siblings)))
    if app.json:
        render.emit_json({"dir": str(directory), "readme": tuned.readme, "tuned": [f.rel for f in tuned.files],
                          **render.results_json(results, lambda p: p.to_dict())})
    else:
        print_plan(tuned, results)
    code = exit_code_for(results)
    if code == ExitCode.OK and any(r.value and (r.value.refusals or (strict and r.value.warnings))
                                   for r in results.values()):
        return int(ExitCode.BAD_ANSWER)  # a file this host's SGLang would reject, or --strict and a warning
    return code


def plan_inputs(ctx: Any, venv: str | None, tuned: TunedSet, siblings: set[str]) -> tuple[Any, TunedSet, Any]:
    from fleetctl import kernels as core

    facts, texts = core.gather(ctx, venv, texts_named=siblings)
    return facts, tuned, texts


def print_plan(tuned: TunedSet, results: dict[str, HostResult[KernelPlan]]) -> None:
    from rich.rule import Rule
    from rich.text import Text

    out = render.console()
    out.print(Text(f"tuned configs: {tuned.summary()}"))
    for name, res in results.items():
        if res.value is None:
            continue
        p, f = res.value, res.value.facts
        out.print(Rule(Text(name, style="bold"), align="left", style="dim"))
        gpu = ", ".join(f"{g} -> {d}" for g, d in zip(f.gpu_names, f.device_names, strict=True)) or "unknown"
        out.print(Text(f"GPU:    {gpu} ({f.gpu_source})"))
        out.print(Text(f"triton: {f.triton_version or 'unknown'} -> {f.triton_folder or '?'} ({f.triton_source})"))
        if f.builtin_dir:
            out.print(Text(f"sglang: {f.sglang_version}, built-in configs in {len(f.builtin)} triton folders "
                           f"({'yes' if f.triton_folder in f.builtin else 'no'} {f.triton_folder or '?'})"))
        if p.entries:
            rows = [[e.filename, ", ".join(e.tuned_in), _LOADS[e.status].format(loads=e.loads)] for e in p.entries]
            out.print(render.table(None, ["tuned file", "tuned in", "SGLang loads"], rows))
        for note in p.notes:
            out.print(Text(f"note: {note}"))
        for warning in p.warnings:
            out.print(Text(f"warning: {warning}", style="yellow"))
        for refusal in p.refusals:
            out.print(Text(f"REFUSED: {refusal}", style="red"))
    render.print_failures(results)
    out.print(render.summary_line(results))


@kernels.command()
@click.option("--from", "from_host", required=True, metavar="HOST", shell_complete=complete.host_names,
              help="The host the tuning ran on.")
@click.option("--src", required=True, metavar="DIR", help="Folder on that host holding the tuner's *.json output.")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR, show_default=True,
              help="The repo's tuned configs; files go into its triton_X_Y_Z folder for the host's triton.")
@click.option("--force", is_flag=True, help="Overwrite files whose content differs.")
@venv_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
def collect(app: AppContext, from_host: str, src: str, dest: Path, force: bool, venv: str | None,
            as_json: bool) -> int:
    """Bring a tuning run's config files from HOST into DEST/triton_X_Y_Z/ (the host's triton version),
    validated; a file that differs from one already there is never overwritten without --force."""
    from fleetctl import kernels as core

    hosts = app.selected_hosts(from_host)
    if len(hosts) != 1:
        raise InputError(f"--from {from_host!r} must name one host, it matches {len(hosts)}")
    with app.fleet(from_host) as fleet:
        res = fleet.map(lambda ctx: core.fetch_tuning_output(ctx, src, venv or ctx.host.connection.venv))
    got = res[hosts[0].name].value
    if got is None:
        render.print_failures(res)
        return int(ExitCode.HOST_FAILED)
    items = core.plan_collect(got, dest, force)
    refused = [i for i in items if i.action == "differs"]
    if not refused:
        core.write_collected(got, items, dest)
    if app.json or as_json:
        render.emit_json(_collect_json(got, items, dest, not refused))
    else:
        _print_collect(got, items, dest, refused)
    return int(ExitCode.BAD_ANSWER if refused else ExitCode.OK)


def _collect_json(got: Collected, items: list[CollectItem], dest: Path, written: bool) -> dict[str, Any]:
    return {"host": got.host, "src": got.src, "triton_version": got.triton_version, "triton_source": got.triton_source,
            "dest": str(dest), "written": written, "skipped": got.skipped, "files": [i.__dict__ for i in items]}


def _print_collect(got: Collected, items: list[CollectItem], dest: Path, refused: list[CollectItem]) -> None:
    from rich.text import Text

    out = render.console()
    out.print(Text(f"{got.host}:{got.src} -> {dest} (triton {got.triton_version}: {got.triton_source})"))
    out.print(render.table(None, ["file", "into", "action", "note"],
                           [[i.filename, i.target, i.action, i.note] for i in items]))
    for name in got.skipped:
        out.print(Text(f"skipped: {name}"))
    if refused:
        render.console(stderr=True).print(Text(f"{len(refused)} file(s) differ from those in {dest}; nothing "
                                               "written (--force overwrites)", style="red"))
