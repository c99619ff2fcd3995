"""Drift reports for people and programs: the package x host matrix, JSON, markdown, HTML.

Pure functions of a ``DriftReport``; the CLI picks one. The HTML is one self-contained file
(inline CSS, no external assets), rendered with autoescaping: names and paths come from hosts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.drift.audit import INFO_KINDS, DriftReport, Kind

# Which finding class colours a matrix cell, strongest first.
CELL_KINDS = (Kind.DUPLICATE, Kind.MISSING, Kind.EXTRA, Kind.VERSION, Kind.STACK)


@dataclass(frozen=True)
class Cell:
    text: str
    kind: str  # "" when the host agrees with the baseline


@dataclass(frozen=True)
class Matrix:
    columns: list[str]  # "baseline" first, then hosts
    rows: list[tuple[str, list[Cell]]]


def matrix(report: DriftReport, show_all: bool = False) -> Matrix:
    hosts = list(report.inventories)
    if report.baseline.host in hosts:
        hosts.remove(report.baseline.host)
        hosts.insert(0, report.baseline.host)
    kinds: dict[tuple[str, str | None], Kind] = {}
    for f in (f for fs in report.findings.values() for f in fs if f.kind in CELL_KINDS):
        held = kinds.get((f.host, f.package))
        if held is None or CELL_KINDS.index(f.kind) < CELL_KINDS.index(held):  # the strongest class colours
            kinds[(f.host, f.package)] = f.kind
    rows = []
    stack_rows = list(report.baseline.stack) or list(dict.fromkeys(r for inv in report.inventories.values()
                                                                    for r in inv.stack))
    for row in stack_rows:
        cells = [Cell(str(report.inventories[h].stack.get(row) or "-"), (kinds.get((h, row)) or "")) for h in hosts]
        rows.append((row, [Cell(str(report.baseline.stack.get(row) or "-"), ""), *cells]))
    names = sorted(set(report.baseline.versions) | {n for inv in report.inventories.values() for n in inv.dists})
    for name in names:
        cells = [Cell(report.inventories[h].version(name) or "-", _cell_kind(kinds, h, name)) for h in hosts]
        rows.append((name, [Cell(report.baseline.versions.get(name, "-"), ""), *cells]))
    if not show_all:
        rows = [(name, cells) for name, cells in rows if any(c.kind for c in cells[1:])]
    return Matrix(["baseline", *hosts], rows)


def _cell_kind(kinds: dict[tuple[str, str | None], Kind], host: str, name: str) -> str:
    kind = kinds.get((host, name))
    return kind.value if kind else ""


def to_json(report: DriftReport, show_all: bool = False) -> dict[str, Any]:
    m = matrix(report, show_all)
    return {
        "baseline": {"source": report.baseline.source, "host": report.baseline.host,
                     "versions": report.baseline.versions, "stack": report.baseline.stack},
        "summary": {
            "line": report.summary(), "hosts": len(report.inventories) + len(report.failed),
            "drifting_hosts": report.drifting_hosts, "differing_packages": report.differing_packages(),
            "counts": {k.value: report.count(k) for k in Kind if report.count(k)},
        },
        "hosts": {
            **{h: {"status": "ok", "venv": inv.venv, "python": inv.python, "stack": inv.stack,
                   "files": {k: (inv.files or {}).get(k) for k in ("checked", "cache_hits", "cache_misses", "seconds")}
                   if inv.files else None,
                   "findings": [f.to_dict() for f in report.findings[h]]} for h, inv in report.inventories.items()},
            **{h: {"status": r.status.value, "reason": r.reason} for h, r in report.failed.items()},
        },
        "matrix": matrix_json(m),
    }


def matrix_json(m: Matrix) -> dict[str, Any]:
    return {"columns": m.columns, "rows": [{"name": n, "cells": [c.__dict__ for c in cells]} for n, cells in m.rows]}


def _md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def to_markdown(report: DriftReport, show_all: bool = False) -> str:
    m = matrix(report, show_all)
    lines = [f"## Drift audit: {_md(report.summary())}", "", f"Baseline: {_md(report.baseline.source)}", ""]
    if m.rows:
        lines.append("| package | " + " | ".join(_md(c) for c in m.columns) + " |")
        lines.append("|---" * (len(m.columns) + 1) + "|")
        for name, cells in m.rows:
            shown = [(f"**{_md(c.text)}** ({c.kind})" if c.kind else _md(c.text)) for c in cells]
            lines.append(f"| {_md(name)} | " + " | ".join(shown) + " |")
    else:
        lines.append("No package or stack differences.")
    lines += ["", "### Findings", ""]
    for host, findings in report.findings.items():
        for f in findings:
            note = " (not drift)" if f.kind in INFO_KINDS else ""
            lines.append(f"- `{_md(host)}` **{f.kind.value}**{note}: {_md(f.detail)}")
    for host, res in report.failed.items():
        lines.append(f"- `{_md(host)}` **{res.status.value}**: {_md(res.reason)}")
    if not any(report.findings.values()) and not report.failed:
        lines.append("None.")
    return "\n".join(lines) + "\n"


def to_html(report: DriftReport, show_all: bool = False) -> str:
    """The drift view of the fleet report's renderer: the same stylesheet and drift sections."""
    from fleetctl.pages import render as report_html

    return report_html.render("drift.html.j2", drift=to_view(report, show_all), kinds=[k.value for k in CELL_KINDS])


# --- the view the HTML pages (drift and fleet report) render -------------------------------------

# A finding class's colour: red breaks imports or means files changed under pip; amber differs
# from the baseline without breaking by itself; the information classes are green.
RED_KINDS = frozenset({Kind.VERSION, Kind.MISSING, Kind.DUPLICATE, Kind.MODIFIED, Kind.MISSING_FILE})
KIND_ORDER = (Kind.MISSING, Kind.DUPLICATE, Kind.VERSION, Kind.MODIFIED, Kind.MISSING_FILE, Kind.UNSATISFIED,
              Kind.EXTRA, Kind.STACK, Kind.ORPHAN, Kind.FOREIGN_SHEBANG, Kind.PATCHED, Kind.OVERLAY)


def kind_level(kind: Kind) -> str:
    return "green" if kind in INFO_KINDS else "red" if kind in RED_KINDS else "amber"


def host_verdict(report: DriftReport, host: str) -> dict[str, Any]:
    """One host's drift: its worst class's colour, a text verdict and the count per finding class."""
    if host in report.failed:
        res = report.failed[host]
        return {"level": "red" if res.status.value == "unreachable" else "amber", "counts": {},
                "text": f"not audited: {res.reason}"}
    found = report.findings.get(host, [])
    counts = {k.value: n for k in KIND_ORDER if (n := sum(1 for f in found if f.kind is k))}
    drifting = [k for k in KIND_ORDER if k.value in counts and k not in INFO_KINDS]
    if not drifting:
        info = ", ".join(f"{counts[k.value]} {k.value}" for k in KIND_ORDER if k in INFO_KINDS and k.value in counts)
        return {"level": "green", "counts": counts, "text": "in line" + (f" ({info})" if info else "")}
    level = "red" if any(k in RED_KINDS for k in drifting) else "amber"
    return {"level": level, "counts": counts, "text": ", ".join(f"{counts[k.value]} {k.value}" for k in drifting)}


def classes(report: DriftReport, cap: int = 50) -> list[dict[str, Any]]:
    """Findings grouped by class, worst class first; identical details across hosts gathered."""
    out = []
    for kind in KIND_ORDER:
        hosts_of: dict[str, list[str]] = {}
        for host, findings in report.findings.items():
            for f in findings:
                if f.kind is kind:
                    hosts_of.setdefault(f.detail, []).append(host)
        if not hosts_of:
            continue
        items = [{"hosts": hosts, "detail": detail} for detail, hosts in hosts_of.items()]
        out.append({"kind": kind.value, "level": kind_level(kind), "info": kind in INFO_KINDS,
                    "hosts": sorted({h for i in items for h in i["hosts"]}), "count": report.count(kind),
                    "items": items[:cap], "more": max(0, len(items) - cap)})
    return out


def to_view(report: DriftReport, show_all: bool = False) -> dict[str, Any]:
    m = matrix(report, show_all)
    return {
        "summary": report.summary(), "baseline": report.baseline.source, "show_all": show_all,
        "hosts": [{"host": h, **host_verdict(report, h)} for h in [*report.inventories, *report.failed]],
        "classes": classes(report),
        "matrix": matrix_json(m),
    }


STYLES = {"version": "black on yellow", "missing": "white on red", "extra": "black on cyan",
          "duplicate-dist-info": "white on magenta", "stack": "black on dark_orange"}


def gathered_findings(report: DriftReport) -> dict[tuple[str, tuple[str, ...]], list[str]]:
    """Findings the matrix does not show, identical ones across hosts gathered (like ``clush -b``):
    (kind, hosts) -> details."""
    hosts_of: dict[tuple[str, str], list[str]] = {}
    for host, findings in report.findings.items():
        for f in findings:
            if f.kind not in CELL_KINDS:
                hosts_of.setdefault((f.kind.value, f.detail), []).append(host)
    out: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (kind, detail), hosts in hosts_of.items():
        out.setdefault((kind, tuple(hosts)), []).append(detail)
    return out


def print_table(report: DriftReport, show_all: bool = False, max_findings: int = 8) -> None:
    """The matrix coloured by finding class, then each host's findings (capped), then the summary."""
    from rich.text import Text

    from fleetctl import render

    out = render.console()
    for what, names in report.audited().items():  # what was read, so "no drift" says of what
        out.print(Text.assemble("audited: ", (",".join(names), "bold"), f" {what}"))
    m = matrix(report, show_all)
    if m.rows:
        rows = [[name, *(Text(c.text, style=STYLES.get(c.kind, "")) for c in cells)] for name, cells in m.rows]
        out.print(render.table(f"baseline: {report.baseline.source}", ["package", *m.columns], rows))
    for (kind, hosts), details in gathered_findings(report).items():
        head = Text.assemble((",".join(hosts), "bold"), f" {kind}")
        if len(details) <= max_findings:
            for detail in details:
                out.print(Text.assemble(head, ": ", detail))
        else:
            out.print(Text.assemble(head, f" ({len(details)}): ", "; ".join(details[:max_findings]),
                                    f"; ... (--format json lists all {len(details)})"))
    render.print_failures(report.failed)
    out.print(Text(report.summary(), style="bold"))


def emit(report: DriftReport, fmt: str, output: Path | None, show_all: bool) -> None:
    """Write the report in ``fmt`` to ``output`` (the summary still goes to the terminal) or stdout."""
    import json
    import sys

    if fmt == "table" and output is None:
        print_table(report, show_all)
        return
    text = {
        "json": lambda: json.dumps(to_json(report, show_all), indent=2) + "\n",
        "markdown": lambda: to_markdown(report, show_all),
        "html": lambda: to_html(report, show_all),
        "table": lambda: to_markdown(report, show_all),
    }[fmt]()
    if output is None:
        sys.stdout.write(text)
        return
    from fleetctl import render

    render.write_atomic(output, text)
    sys.stderr.write(f"{report.summary()}\nreport written to {output}\n")
