"""``fleetctl models status|verify|remove``: the models a release spec names (or one model folder), per host.

(``models sync``, the host-to-host fan-out, is another module's command added to this group.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fleetctl import render
from fleetctl.cli.context import AppContext
from fleetctl.cli.guard import approve, yes_option
from fleetctl.cli.model_targets import model_targets
from fleetctl.cli.options import exit_code_for, host_options
from fleetctl.errors import ExitCode
from fleetctl.transport.base import HostResult

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetctl.models.spec import ModelRef
    from fleetctl.models.status import ModelState
    from fleetctl.transport.fleet import HostContext

TARGET_HELP = "TARGET: a release spec (every model its models: names) or a model folder's absolute path on the hosts."


@click.group()
def models() -> None:
    """Models on the fleet: what each host holds, verified in tiers, and removal."""


@models.command(epilog=TARGET_HELP)
@click.argument("target")
@host_options
@click.pass_obj
def status(app: AppContext, target: str) -> int:
    """Host x model: revision, complete (quick tier: sizes, symlinks, safetensors headers, index), when its
    bytes were last verified, size, free space of its volume. Exit 1 when some model is missing, incomplete
    or corrupt; 2 when some host failed."""
    return _check(app, target, "quick")


@models.command(epilog=TARGET_HELP)
@click.argument("target")
@click.option("--full", is_flag=True, help="sha256 of every byte (default: the quick tier, and every file "
                                           "changed since its last hash hashed again, as a deploy does).")
@host_options
@click.pass_obj
def verify(app: AppContext, target: str, full: bool) -> int:
    """Verify the models on each host; exit 1 naming host and file when one is missing, incomplete or corrupt."""
    return _check(app, target, "full" if full else "deploy")


@models.command(epilog=TARGET_HELP)
@click.argument("target")
@yes_option
@host_options
@click.pass_obj
def remove(app: AppContext, target: str) -> int:
    """Remove the models from the hosts (a HF snapshot with the blobs no other snapshot links); a model
    that a kept release on the host names is never removed: that host is refused in one line."""
    from fleetctl.models import status as core

    refs, _ = model_targets(target)
    approve(app, "models remove", f"remove {', '.join(r.label() for r in refs)}")
    with app.fleet() as fleet:
        results = fleet.map(lambda ctx: core.remove_on_host(ctx, refs))
    if app.json:
        render.emit_json(render.results_json(results, lambda v: v))
    else:
        rows = [[name, m["path"], core.removal_text(m), core.size_text(m["freed_bytes"])]
                for name, res in results.items() for m in (res.value or [])]
        render.console().print(render.table(None, ["host", "model", "action", "freed"], rows))
        render.print_failures(results)
    return exit_code_for(results)


def _check(app: AppContext, target: str, tier: str) -> int:
    from fleetctl.models import status as core

    refs, release_id = model_targets(target)
    # Progress while the hosts hash (deploy and full tiers): on a terminal only, never into --json.
    shown = HashProgress() if tier != "quick" and not app.json and render.console().is_terminal else None

    def check(ctx: HostContext) -> list[ModelState]:
        answered = False
        try:
            states = core.check_host(ctx, refs, tier, progress=shown.seen(ctx.name) if shown else None)
            answered = True
            return states
        finally:
            if shown is not None:
                shown.done(ctx.name, answered)

    try:
        with app.fleet(read_only=tier == "quick") as fleet:
            results = fleet.map(check)
    finally:
        if shown is not None:
            shown.stop()
    if app.json:
        doc = render.results_json(results, lambda states: [s.to_dict() for s in states])
        render.emit_json({"target": target, "release_id": release_id or None, "tier": tier,
                          "models": [r.to_dict() for r in refs], **doc})
    else:
        _print(results, refs)
    code = exit_code_for(results)
    if code == ExitCode.OK and any(not s.ok for r in results.values() for s in r.value or []):
        return int(ExitCode.BAD_ANSWER)
    return code


def _print(results: dict[str, HostResult[list[ModelState]]], refs: list[ModelRef]) -> None:
    from rich.text import Text

    from fleetctl.models.status import size_text, verified_when

    rows: list[list[Any]] = []
    for name, res in sorted(results.items()):
        for s in res.value or []:
            state = Text(s.state, style="green" if s.ok else "red")
            rows.append([name, s.role, _short(s.revision), state, verified_when(s.verified_at), size_text(s.bytes),
                         size_text(s.free_bytes)])
    out = render.console()
    out.print(render.table(None, ["host", "model", "revision", "complete", "verified", "bytes", "free"], rows))
    err = render.console(stderr=True)
    for name, res in sorted(results.items()):
        for s in res.value or []:
            for p in s.problems:
                where = f"{s.path.rstrip('/')}/{p.file}" if p.file else s.path
                err.print(Text(f"{name}: model {s.role}: {where}: {p.what}"), soft_wrap=True)
    render.print_failures(results)
    out.print(Text(render.summary_line(results)))


class HashProgress:
    """``models verify``'s bytes hashed per host, drawn by ``models sync``'s progress display from the same
    tally (bytes, rate, ETA per host); a host appears with its first progress frame (one that hashes)."""

    def __init__(self) -> None:
        from fleetctl.cli.models_sync import Progress
        from fleetctl.models.links import Tally

        self.display = Progress("hashed")
        self.tally = Tally({}, on_change=self.display.update)

    def seen(self, host: str) -> Callable[[int, int], None]:
        from fleetctl.models.links import HostTally

        def frame(hashed: int, total: int) -> None:
            with self.tally.lock:
                self.tally.hosts.setdefault(host, HostTally()).need_bytes = total
                self.tally.apply({"host": host, "ev": "progress", "bytes": hashed})
        return frame

    def done(self, host: str, answered: bool) -> None:
        with self.tally.lock:
            self.tally.apply({"host": host, "ev": "done", "ok": answered})

    def stop(self) -> None:
        self.display.stop()


def _short(revision: str | None) -> str:
    if not revision:
        return "?"
    return revision[:19] if revision.startswith("sha256:") else revision[:12]


from fleetctl.cli.models_sync import sync  # noqa: E402 - the host-to-host fan-out (its own module)

models.add_command(sync)
