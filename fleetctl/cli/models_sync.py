"""``fleetctl models sync``: a model from one source to the selected hosts, host to host (added to the
``models`` group)."""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING, Any

import click

from fleetctl import render
from fleetctl.cli.context import AppContext
from fleetctl.cli.model_targets import model_targets
from fleetctl.cli.options import exit_code_for, host_options
from fleetctl.errors import InputError

if TYPE_CHECKING:
    from fleetctl.models.fanout import SyncReport
    from fleetctl.models.links import Tally

RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?(?:/s)?\s*$", re.IGNORECASE)


def parse_rate(text: str | None) -> float:
    """``50M``, ``50MB/s``, ``400k``, ``1g`` (powers of 1000, as rsync's --bwlimit takes them) in bytes/s."""
    if not text:
        return 0.0
    m = RATE.match(text)
    if m is None:
        raise InputError(f"--limit-rate {text}: a rate such as 50M, 50MB/s or 400k")
    return float(m.group(1)) * 1000 ** " kmg".index((m.group(2) or " ").lower())


@click.command()
@click.argument("target")
@click.option("--from", "source", required=True, metavar="HOST|FOLDER",
              help="A host that holds the model at the same path, or a model folder on this machine.")
@click.option("--limit-rate", "limit_rate", metavar="RATE", help="Cap every link at RATE (50M = 50 MB/s).")
@click.option("--stall-timeout", "stall_s", type=click.FloatRange(1), default=60.0, show_default=True,
              metavar="SECONDS", help="A link that takes or sends nothing this long is cut from the chain.")
@click.option("--hf-download", "hf_download", is_flag=True,
              help="First `hf download` each Hugging Face model's pinned revision into the --from host's cache "
                   "(its token: the host var hf_token, vault-encrypted), then fan it out from there.")
@host_options
@click.pass_obj
def sync(app: AppContext, target: str, source: str, limit_rate: str | None, stall_s: float,
         hf_download: bool) -> int:
    """Put the model (TARGET: a model folder's absolute path on the hosts, or a release spec's models: folders
    or Hugging Face cache snapshots, each with only its revision's blobs)
    on every selected host: the source sends each byte once, the hosts pass it on to each other in a
    pipelined chain; each file is hashed as it lands, the model appears only when complete, a re-run
    sends only what is missing. Exit 2 when some host did not get it."""
    from fleetctl.models import fanout
    from fleetctl.transport.fleet import Fleet

    refs, _ = model_targets(target)
    on_host = source in app.inventory.hosts
    if hf_download and (not on_host or any(r.layout != "hf_cache" for r in refs)):
        raise InputError("--hf-download needs --from a host in the inventory and only Hugging Face cache models "
                         "(hf_cache) in TARGET")
    if not on_host and not (os.path.isabs(source) and os.path.isdir(source)):
        raise InputError(f"--from {source}: neither a host in {app.inventory.path} nor a folder on this machine")
    targets = [h for h in app.selected_hosts() if h.name != source]
    if not targets:
        raise InputError("no target hosts: the selection holds only the source" if on_host else "no target hosts")
    rate = parse_rate(limit_rate)
    reports = []
    settings = app.run_settings(persist=0.0, workers=1)  # a change: connections of its own, in this process
    sources = [app.inventory.hosts[source]] if on_host else []
    with Fleet(app.inventory, sources, settings) as src, Fleet(app.inventory, targets, settings) as fleet:
        for ref in refs:
            req = fanout.SyncRequest(ref.path, source if on_host else None, None if on_host else source, rate,
                                     stall_s, ref.revision, ref.layout, ref.root, ref.repo, hf_download)
            display = Progress() if not app.json and render.console().is_terminal else None
            try:
                reports.append(fanout.run_sync(req, src.contexts[source] if on_host else None, fleet,
                                               display.update if display else None))
            finally:
                if display is not None:
                    display.stop()
    if app.json:
        docs = [report_json(r) for r in reports]
        render.emit_json(docs[0] if len(docs) == 1 else {"models": docs})
    else:
        for report in reports:
            print_report(report)
    return max(exit_code_for(r.results) for r in reports)


class Progress:
    """Bytes, rate and ETA per host on a terminal, redrawn at most four times a second (``models sync``'s
    bytes landed; ``models verify``'s bytes hashed, ``column`` "hashed")."""

    def __init__(self, column: str = "landed") -> None:
        from rich.live import Live

        self.live = Live(console=render.console(), refresh_per_second=4, transient=True)
        self.live.start()
        self.last = 0.0
        self.column = column

    def update(self, tally: Tally) -> None:
        now = time.monotonic()
        if now - self.last < 0.25:
            return
        self.last = now
        rows = []
        for host, t in tally.hosts.items():
            eta = t.eta()
            state = "done" if t.ok else ("failed" if t.done else ("cut" if t.cuts else "..."))
            rows.append([host, f"{t.written / 1e6:,.1f} / {t.need_bytes / 1e6:,.1f} MB", f"{t.rate() / 1e6:,.1f} MB/s",
                         f"{eta:,.0f}s" if eta is not None else "", state])
        self.live.update(render.table(None, ["host", self.column, "rate", "eta", "state"], rows))

    def stop(self) -> None:
        self.live.stop()


def report_json(report: SyncReport) -> dict[str, Any]:
    req, m = report.request, report.manifest
    return {"path": req.path, "source": req.source or req.source_dir, "name": m["name"], "revision": m["revision"],
            "model_bytes": m["total_bytes"], "source_bytes_sent": report.source_bytes_sent,
            "seconds": round(report.seconds, 3), "phases": report.phases, "line": report.summary(),
            **render.results_json(report.results, lambda v: v.to_dict())}


def print_report(report: SyncReport) -> None:
    out = render.console()
    rows = []
    for host, res in report.results.items():
        v = res.value
        what = ("already complete, nothing sent" if v and v.state == "complete" else
                f"synced via {v.via}: {v.written:,} B landed" if v and res.ok else res.reason)
        rows.append([host, render.status_text(res), what])
    out.print(render.table(f"models sync {report.request.path} (revision {report.manifest['revision'][:19]})",
                           ["host", "status", "result"], rows))
    render.print_failures(report.results)
    out.print(report.summary())
