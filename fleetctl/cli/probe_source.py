"""``fleetctl probe grep`` and ``fleetctl probe symbol``: the installed source, host by host."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from fleetctl import render
from fleetctl.cli.context import AppContext
from fleetctl.cli.options import expect_option, finish, host_options, venv_option
from fleetctl.probes import Expect
from fleetctl.probes.search import (
    CountRow,
    FileHits,
    GrepHostResult,
    GrepRequest,
    count_matrix,
    expectation,
    matrix_json,
    run_grep,
)
from fleetctl.probes.symbols import Occurrence, SymbolHostResult, SymbolRequest, is_found, run_symbol
from fleetctl.transport.base import HostResult

T = TypeVar("T")

package_option = click.option("--package", default="sglang", show_default=True, metavar="NAME",
                              help="Import name of the package whose installed source is searched.")
subpath_option = click.option("--subpath", metavar="PATH", help="Only this folder or file under the package, e.g. srt.")


@click.command()
@click.argument("terms", nargs=-1, required=True)
@package_option
@subpath_option
@click.option("-i", "--ignore-case", is_flag=True, help="Match case-insensitively.")
@click.option("--regex", is_flag=True, help="TERMs are Python regular expressions (checked before connecting).")
@click.option("--max-hits", type=click.IntRange(min=0), default=200, show_default=True,
              help="Matching lines listed per host; the counts always cover every match.")
@click.option("--context", "context", type=click.IntRange(0, 50), default=0, metavar="N",
              help="Lines of context shown around each listed match.")
@click.option("--no-cache", "no_cache", is_flag=True,
              help="Read every file: neither use nor update the host's grep cache (by default a file "
                   "an earlier search with the same terms read is answered from what it found there, "
                   "unread, while its size, mtime, inode and ctime are unchanged).")
@venv_option
@expect_option
@host_options
@click.pass_obj
def grep(app: AppContext, terms: tuple[str, ...], package: str, subpath: str | None, ignore_case: bool,
         regex: bool, max_hits: int, context: int, no_cache: bool, venv: str | None, expect: str | None) -> int:
    """Search the installed source of a package for TERMs on every host.

    Lists each matching line as FILE:LINE: TEXT (paths as in site-packages, e.g. sglang/srt/...),
    hosts with identical listings gathered, then a TERM x HOST matrix of matching-line counts.
    Text files only: __pycache__ and binary files (a NUL byte in the first 8 KB) are skipped.

    --expect present: exit 1 when some host has zero matching lines for ANY term (every term must
    be found on every host). --expect absent: exit 1 when some host matches ANY term.
    """
    request = GrepRequest(terms, package, subpath, ignore_case, regex, max_hits, context, venv, not no_cache)
    request.validate()
    with app.fleet(read_only=True, in_venv=venv or True) as fleet:
        results = run_grep(fleet, request)
    rows = count_matrix(results, request.terms)
    if app.json:
        doc = render.results_json(results, lambda v: v.to_dict())
        render.emit_json({**doc, "matrix": matrix_json(rows)})
    else:
        print_grep(results, rows, max_hits)
    what = "every term" if expect == Expect.PRESENT.value else "all terms"
    found = expectation(Expect(expect)) if expect else None
    return finish(results, expect, found, what)


@click.command()
@click.argument("name")
@package_option
@subpath_option
@venv_option
@expect_option
@host_options
@click.pass_obj
def symbol(app: AppContext, name: str, package: str, subpath: str | None, venv: str | None,
           expect: str | None) -> int:
    """Where NAME (or Class.member) is DEFINED, apart from where it is only REFERENCED, on every host.

    Python files are parsed with ast (only those whose bytes contain the name). Definitions: def,
    async def, class, module- or class-level assignment (an enum member). References: calls,
    attribute accesses, name loads, imports (an `import x as NAME` alias defines nothing).
    Files that do not parse are listed. --expect present: exit 1 where NAME is not defined.
    """
    request = SymbolRequest(name, package, subpath, venv)
    request.validate()
    with app.fleet(read_only=True, in_venv=venv or True) as fleet:
        results = run_symbol(fleet, request)
    if app.json:
        render.emit_json(render.results_json(results, lambda v: v.to_dict()))
    else:
        print_symbol(results, name)
    return finish(results, expect, is_found, f"a definition of {name}")


# -- rendering ------------------------------------------------------------------------------

def gather(results: dict[str, HostResult[T]], key: Callable[[T], Any]) -> list[tuple[list[str], T]]:
    """Answering hosts with identical listings, as ``clush -b``: [(hosts, one of their values)]."""
    groups: dict[Any, tuple[list[str], T]] = {}
    for host, res in sorted(results.items()):
        if res.ok and res.value is not None:
            groups.setdefault(key(res.value), ([], res.value))[0].append(host)
    return sorted(groups.values(), key=lambda g: (-len(g[0]), g[0]))


def heading(hosts: Sequence[str], detail: str) -> Any:
    """One line per gathered group; printed with soft_wrap so nothing is cut at the terminal width."""
    from rich.text import Text

    return Text.assemble(("── ", "dim"), (f"{','.join(hosts)} ({len(hosts)})", "bold"), (" ── ", "dim"), detail)


def line(path: str, number: int, sep: str, text: str, style: str = "") -> Any:
    """``path:line: text`` (``path-line- text`` for context): literal text, never markup."""
    from rich.text import Text

    return Text.assemble((f"{path}{sep}{number}{sep} ", "cyan" if sep == ":" else "dim"), (text, style))


def file_lines(f: FileHits) -> list[Any]:
    """A file's listed hits with their context merged in line order, ``--`` between gaps."""
    from rich.text import Text

    merged = sorted([(h.line, ":", h.text) for h in f.hits] + [(n, "-", t) for n, t in f.context])
    out: list[Any] = []
    previous = None
    for number, sep, text in merged:
        if f.context and previous is not None and number > previous + 1:
            out.append(Text("--", style="dim"))
        out.append(line(f.path, number, sep, text, "" if sep == ":" else "dim"))
        previous = number
    return out


def print_grep(results: dict[str, HostResult[GrepHostResult]], rows: list[CountRow], max_hits: int) -> None:
    from rich.text import Text

    out = render.console()
    shown_as: dict[int, str] = {}  # hosts that matched alike hold one list (probes.search): its text once

    def same_lines(v: GrepHostResult) -> tuple[str, str, int]:
        if id(v.files) not in shown_as:
            shown_as[id(v.files)] = repr(v.files)
        return v.package_dir, shown_as[id(v.files)], v.matched_lines

    for hosts, v in gather(results, same_lines):
        detail = f"{v.matched_lines} matching lines in {len(v.files)} of {v.searched_files} files, {v.package_dir}"
        out.print(heading(hosts, detail), soft_wrap=True)
        shown = [f for f in v.files if f.hits]
        for i, f in enumerate(shown):
            if i and f.context:  # as grep -C: "--" keeps groups of lines apart
                out.print(Text("--", style="dim"))
            for item in file_lines(f):
                out.print(item, soft_wrap=True)
        if v.unreadable_files:
            out.print(Text(f"{v.unreadable_files} files could not be read", style="yellow"))
        if v.not_shown:
            out.print(Text(f"... {v.not_shown} more matching lines not shown (--max-hits {max_hits}); "
                           "the counts below are complete", style="yellow"), soft_wrap=True)
    if any(res.ok for res in results.values()):
        out.print(Text("matching lines per TERM and host (0: none there)", style="bold"), soft_wrap=True)
        out.print(matrix_table(rows))
    render.print_failures(results)
    out.print(render.summary_line(results))


def matrix_table(rows: list[CountRow]) -> Any:
    from rich.text import Text

    hosts = list(rows[0].counts) if rows else []

    def count_cell(n: int | None) -> Any:
        if n is None:
            return Text("-", style="dim")
        return Text(str(n), style="bold red" if n == 0 else "green")

    body = [[Text(r.term)] + [count_cell(r.counts[h]) for h in hosts] for r in rows]
    return render.table(None, ["term", *hosts], body)


def occurrence_line(o: Occurrence) -> Any:
    from rich.text import Text

    where = f"{o.kind} in {o.scope}" if o.scope else f"{o.kind} at module level"
    return Text.assemble("  ", line(o.path, o.line, ":", o.text), (f"  ({where})", "dim"))


def print_symbol(results: dict[str, HostResult[SymbolHostResult]], name: str) -> None:
    from rich.text import Text

    out = render.console()
    for hosts, v in gather(results, lambda v: (v.package_dir, repr(v.definitions), repr(v.references),
                                               repr(v.unparsable))):
        detail = f"{name}: {v.candidate_files} of {v.searched_files} files parsed, {v.package_dir}"
        out.print(heading(hosts, detail), soft_wrap=True)
        sections = (("defined", v.definitions, "green"), ("referenced", v.references, "cyan"))
        for title, items, style in sections:
            out.print(Text(f"{title} ({len(items)})", style=f"bold {style}" if items else "bold red"))
            for o in items:
                out.print(occurrence_line(o), soft_wrap=True)
        for u in v.unparsable:
            out.print(Text(f"  unparsable: {u.path}: {u.error}", style="yellow"), soft_wrap=True)
    out.print(Text(f"{name} per host (defined 0: not defined there)", style="bold"), soft_wrap=True)
    out.print(symbol_table(results))
    render.print_failures(results)
    out.print(render.summary_line(results))


def symbol_table(results: dict[str, HostResult[SymbolHostResult]]) -> Any:
    from rich.text import Text

    rows = []
    for host, res in sorted(results.items()):
        v = res.value
        if not res.ok or v is None:
            rows.append([host, render.status_text(res), "", ""])
            continue
        defined = Text(str(len(v.definitions)), style="green" if v.definitions else "bold red")
        rows.append([host, defined, len(v.references), len(v.unparsable)])
    return render.table(None, ["host", "defined", "referenced", "unparsable"], rows)
