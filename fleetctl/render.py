"""Output for people (rich tables on a terminal) and for programs (one JSON document).

The core returns data; this module alone decides how it looks. No core module prints. Secrets are
masked here before the text is laid out (a table may fold a long value across lines, JSON escapes
it), and again by the streams themselves (``redact.py``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from fleetctl import redact
from fleetctl.transport.base import HostResult, Status

T = TypeVar("T")

STATUS_STYLE = {Status.OK: "green", Status.FAILED: "red", Status.UNREACHABLE: "magenta"}


def console(stderr: bool = False) -> Any:
    out = _redacting_console()(stderr=stderr, highlight=False, soft_wrap=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = 140  # a log or a pipe: release ids and paths need not wrap at 80 columns
    return out


@functools.cache
def _redacting_console() -> Any:
    from rich.console import Console

    class RedactingConsole(Console):
        """Strings and rich texts masked before rich lays them out (wrapping could split a secret)."""

        def print(self, *objects: Any, **kwargs: Any) -> None:
            super().print(*(masked_renderable(o) for o in objects), **kwargs)

    return RedactingConsole


def masked_renderable(value: Any) -> Any:
    """A str or rich Text with every registered secret masked (styles kept); other renderables as given."""
    from rich.text import Text

    if isinstance(value, str):
        return redact.redact(value)
    if not isinstance(value, Text) or redact.redact(value.plain) == value.plain:
        return value
    out, start = Text(), 0
    for at, end in _secret_spans(value.plain):
        out.append(value[start:at])
        out.append(redact.MASK)
        start = end
    out.append(value[start:])
    return out


def _secret_spans(plain: str) -> list[tuple[int, int]]:
    """Where the registered secrets are in ``plain``, in order, none overlapping (longest first wins)."""
    spans: list[tuple[int, int]] = []
    for secret in redact.REGISTRY.values:
        at = plain.find(secret)
        while at != -1:
            if all(end <= at or at + len(secret) <= start for start, end in spans):
                spans.append((at, at + len(secret)))
            at = plain.find(secret, at + 1)
    return sorted(spans)


def print_diff(out: Any, text: str) -> None:
    """A diff never cut: on a terminal coloured and wrapped at its width; elsewhere (a pipe, a log) the
    text itself, whole lines, as no width applies there."""
    text = redact.redact(text)  # before a terminal's wrapping could split a secret
    if not out.is_terminal:
        out.file.write(text if text.endswith("\n") else text + "\n")
        out.file.flush()
        return
    from rich.syntax import Syntax

    out.print(Syntax(text, "diff", theme="ansi_dark", word_wrap=True), soft_wrap=False)


JSON_INDENTED_LEVELS = 3  # the document, its "hosts", each host: one line per field of a host's entry


def emit_json(doc: Any) -> None:
    """``--json`` output: indented down to each host's entry, each value below on one line.

    json's indenting encoder is pure Python: on a 32-host ``probe grep --json`` (2.5 MB) it took
    170 ms, the C encoder that writes a value on one line 23 ms. Written piece by piece, never the
    whole text at once (a thousand hosts' matched lines are ~80 MB of it). Secrets masked before
    JSON escapes them."""
    write = sys.stdout.write
    for piece in _json_pieces(doc, 0):
        write(piece)
    write("\n")


def _json_pieces(value: Any, level: int) -> Iterator[str]:
    if (level >= JSON_INDENTED_LEVELS or not value or not isinstance(value, dict | list | tuple)
            or (isinstance(value, dict) and not all(isinstance(k, str) for k in value))):  # json's own key rules
        yield json.dumps(redact.redact_obj(value), default=str)
        return
    pad = "  " * (level + 1)
    pairs = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    yield "{\n" if isinstance(value, dict) else "[\n"
    for i, (key, item) in enumerate(pairs):
        yield (",\n" if i else "") + pad + ("" if key is None else f"{json.dumps(key)}: ")
        yield from _json_pieces(item, level + 1)
    yield "\n" + "  " * level + ("}" if isinstance(value, dict) else "]")


def write_atomic(path: Any, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it: never a half-written file."""
    from pathlib import Path

    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(redact.redact(text), encoding="utf-8")
    tmp.replace(target)


def results_json(results: dict[str, HostResult[T]], value: Callable[[T], Any]) -> dict[str, Any]:
    """``{"hosts": {name: {"status", "value"|"reason", ...}}, "summary": {...}}``."""
    hosts: dict[str, Any] = {}
    for name, res in results.items():
        entry: dict[str, Any] = {"status": res.status.value}
        if res.value is not None:
            entry["value"] = value(res.value)
        if not res.ok:
            entry["reason"] = res.reason
            entry.update({k: v for k, v in res.details.items() if k != "traceback"})
        hosts[name] = entry
    return {"hosts": hosts, "summary": summary_counts(results)}


def summary_counts(results: dict[str, HostResult[Any]]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for res in results.values():
        counts[res.status.value] += 1
    return counts


def summary_line(results: dict[str, HostResult[Any]]) -> str:
    c = summary_counts(results)
    return f"{len(results)} hosts: {c['ok']} ok, {c['failed']} failed, {c['unreachable']} unreachable"


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], whole: Sequence[str] = ()) -> Any:
    """``whole``: columns whose cells are never folded (a URL someone greps for): the others give way."""
    from rich.table import Table

    t = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        t.add_column(col, overflow="ignore", no_wrap=True) if col in whole else t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*(cell(v) for v in row))
    return t


def cell(value: Any) -> Any:
    """Table cells are literal text: host output must never be read as rich markup."""
    from rich.text import Text

    if isinstance(value, Text):
        return masked_renderable(value)
    return Text("" if value is None else redact.redact(str(value)))


def status_text(res: HostResult[Any]) -> Any:
    from rich.text import Text

    return Text(res.status.value, style=STATUS_STYLE[res.status])


def print_failures(results: dict[str, HostResult[Any]]) -> None:
    """One line per bad host on stderr: name, status, reason."""
    from rich.text import Text

    err = console(stderr=True)
    for name, res in sorted(results.items()):
        if not res.ok:
            err.print(Text.assemble((name, "bold"), ": ", status_text(res), ": ", res.reason),
                      soft_wrap=True)  # one line per host, however wide: never wrapped


def print_blocks(blocks: Sequence[Any]) -> None:
    """``clush -b`` style: one header per set of hosts with identical output. Host output is never
    re-wrapped: tracebacks and paths stay one line each."""
    from rich.rule import Rule
    from rich.text import Text

    out = console()
    for block in blocks:
        head = ",".join(block.hosts) + f" ({len(block.hosts)})"
        if block.status != "ok" or block.rc not in (0, None):
            head += f" [{block.status}" + (f", rc={block.rc}" if block.rc is not None else "") + "]"
        out.print(Rule(Text(head, style="bold"), align="left", style="dim"))
        if block.stdout:
            out.print(Text(block.stdout.rstrip("\n")), soft_wrap=True)
        if block.stderr:
            out.print(Text(block.stderr.rstrip("\n"), style="red"), soft_wrap=True)


def print_facts(results: dict[str, HostResult[Any]]) -> None:
    """Facts gathered like ``clush -b``: a value all hosts share is shown once, differences by host."""
    from fleetctl.facts import facts_table_rows

    per_host = {name: dict(facts_table_rows(r.value)) for name, r in results.items() if r.ok and r.value}
    labels: list[str] = []
    for facts in per_host.values():
        labels += [label for label in facts if label not in labels and label != "host"]
    out = console()
    if per_host:
        rows = [[label, gathered({h: f.get(label, "-") for h, f in per_host.items()})] for label in labels]
        title = f"facts of {len(per_host)} hosts ({', '.join(per_host)}); a value shown once is the same on all"
        out.print(table(title, ["fact", "value"], rows))
    print_failures(results)
    out.print(summary_line(results))


def gathered(values: dict[str, str]) -> str:
    """One value when every host agrees, else ``hosts: value`` lines, the largest group first."""
    groups: dict[str, list[str]] = {}
    for host, value in values.items():
        groups.setdefault(value, []).append(host)
    if len(groups) == 1:
        return next(iter(groups))
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    return "\n".join(f"{','.join(hosts)}: {value}" for value, hosts in ordered)


LEVEL_STYLE = {"green": "green", "amber": "bold dark_orange", "red": "bold red"}


def level_text(level: str) -> Any:
    """A verdict as a word beside its colour ("RED", "AMBER", "green"): readable without colour too."""
    from rich.text import Text

    return Text(level.upper() if level != "green" else level, style=LEVEL_STYLE.get(level, ""))


def print_gpu_health(results: dict[str, HostResult[Any]], rows: Sequence[Sequence[Any]]) -> None:
    """``gpu health``: one row per check, then each host's verdict and the failed hosts."""
    from rich.text import Text

    out = console()
    table_rows = [[host, gpu, rule, level_text(str(level)), value] for host, gpu, rule, level, value in rows]
    out.print(table("GPU health", ["host", "gpu", "check", "verdict", "value"], table_rows))
    for name, res in sorted(results.items()):
        if res.ok and res.value is not None:
            level = str(res.value.level)
            out.print(Text.assemble((name, "bold"), ": ", level_text(level),
                                    res.value.summary().removeprefix(level)))
    print_failures(results)
    out.print(summary_line(results))
