"""``probe import``, ``probe http``, ``probe script``: ask each host's runtime, not its files."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from fleetctl import render
from fleetctl.adhoc import OutputBlock
from fleetctl.cli.context import AppContext
from fleetctl.cli.options import exit_code_for, expect_option, finish, host_options, venv_option
from fleetctl.errors import ExitCode
from fleetctl.probes import as_dict
from fleetctl.probes import http as http_core
from fleetctl.probes import imports as import_core
from fleetctl.probes import script as script_core
from fleetctl.transport.base import HostResult

T_Result = dict[str, HostResult[Any]]


def _timeout_option(default: float, what: str) -> Callable[[Any], Any]:
    return click.option("--timeout", type=click.FloatRange(min=0.1), default=default, show_default=True,
                        metavar="SECONDS", help=f"Stop {what} after this long on a host.")


@click.command(name="import")
@click.argument("target", metavar="MODULE[:ATTR]")
@venv_option
@_timeout_option(import_core.DEFAULT_TIMEOUT, "the import")
@expect_option
@host_options
@click.pass_obj
def import_(app: AppContext, target: str, venv: str | None, timeout: float, expect: str | None) -> int:
    """Import MODULE with each host's venv python: its file, owning distribution and version,
    whether ATTR (dotted, e.g. SpeculativeAlgorithm.DFLASH) exists, or the import error verbatim.

    An import that raises is an answer (not imported); a missing venv or a timeout fails the host.
    --expect present means: it imports, and ATTR exists when given.
    """
    request = import_core.ImportRequest.parse(target, venv, timeout)
    with app.fleet(read_only=True) as fleet:
        results = import_core.run_import(fleet, request)
    if app.json:
        render.emit_json(render.results_json(results, as_dict))
    else:
        _print_gathered(results, _import_block, f"import {request.target}")
    return finish(results, expect, lambda a: a.present, request.target)


@click.command()
@click.argument("path")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help=f"Service port (default: each host's service_port var, else {http_core.DEFAULT_PORT}).")
@click.option("--field", "fields", multiple=True, metavar="a.b.0.c",
              help="Show only this value of the JSON body (dotted path, list indices); repeatable.")
@_timeout_option(http_core.DEFAULT_TIMEOUT, "waiting for the service")
@click.option("--expect-status", type=click.IntRange(100, 599), default=None, metavar="CODE",
              help="Exit 1 when a host's answer is not this HTTP status (refused counts), naming those hosts.")
@host_options
@click.pass_obj
def http(app: AppContext, path: str, port: int | None, fields: tuple[str, ...], timeout: float,
         expect_status: int | None) -> int:
    """GET http://SERVICE_HOST:PORT/PATH from each host itself (service_host var, default 127.0.0.1):
    status, latency, content type and the JSON body (or only --field values, or the text, truncated).

    /server_info and /model_info fall back to /get_server_info and /get_model_info on a 404
    (older SGLang), and the answer says which path answered.
    """
    request = http_core.HttpRequest(path, port, fields, timeout)
    with app.fleet(read_only=True) as fleet:
        results = http_core.run_http(fleet, request)
    if app.json:
        render.emit_json(render.results_json(results, as_dict))
    else:
        _print_http(results, request)
    code = exit_code_for(results)
    if expect_status is None:
        return code
    report = http_core.check_status(results, expect_status, path)
    render.console(stderr=True).print(report.message(), markup=False)
    return int(ExitCode.BAD_ANSWER) if code == ExitCode.OK and not report.ok else code


@click.command()
@click.argument("file", metavar="FILE.py")
@click.option("--arg", "args", multiple=True, metavar="KEY=VALUE", help="An argument for the script; repeatable.")
@venv_option
@click.option("--python", metavar="PATH", help="Interpreter on the hosts (overrides the venv's python).")
@_timeout_option(script_core.DEFAULT_TIMEOUT, "(kill) the script")
@host_options
@click.pass_obj
def script(app: AppContext, file: str, args: tuple[str, ...], venv: str | None, python: str | None,
           timeout: float) -> int:
    """Run your own stdlib-only Python script FILE.py on every host; identical outputs are gathered.

    \b
    The contract (examples/probes/README.md has examples):
      python     the venv's (--venv or the host's venv var), --python, else the agent's own
      arguments  env FLEETCTL_ARGS = JSON object of the --arg strings; also sys.argv[1:] as key=value
      stdout     one JSON document comes back parsed ("json"), anything else as "text"
      failure    a non-zero exit (an uncaught exception: the traceback's last lines) or the timeout
                 fails that host; its output is kept
      file       the source travels with the request, runs from a private temporary file, removed after
    """
    timeout = min(timeout, app.timeout or timeout)  # -T caps the script's own timeout
    request = script_core.ScriptRequest.load(file, args, venv, python, timeout)
    with app.fleet(read_only=True) as fleet:
        results = script_core.run_script(fleet, request)
    if app.json:
        render.emit_json(render.results_json(results, as_dict))
    else:
        render.print_blocks(script_core.gather_outputs(results, file))
        render.console().print(render.summary_line(results))
    return exit_code_for(results)


# -- rendering ---------------------------------------------------------------------------------

def _print_gathered(results: T_Result, describe: Callable[[Any], tuple[str, str]], title: str) -> None:
    render.console().print(title, markup=False, highlight=False)
    render.print_blocks(_blocks(results, describe))
    render.console().print(render.summary_line(results))


def _blocks(results: T_Result, describe: Callable[[Any], tuple[str, str]]) -> list[OutputBlock]:
    """``clush -b`` style: hosts whose (status, output, error) are identical share one block."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for name, res in sorted(results.items()):
        out, err = describe(res.value) if res.value is not None else ("", res.reason)
        groups.setdefault((res.status.value, out, err), []).append(name)
    blocks = [OutputBlock(tuple(hosts), None, out, err, status) for (status, out, err), hosts in groups.items()]
    return sorted(blocks, key=lambda b: (b.status != "ok", -len(b.hosts), b.hosts))


def _import_block(a: import_core.ImportAnswer) -> tuple[str, str]:
    lines = ["imported" if a.imported else f"NOT imported: {a.error_type}: {a.error}"]
    if a.file:
        lines.append(f"file    {a.file}")
    if a.stdlib:
        lines.append("owner   (Python's standard library)")
    for i, owner in enumerate(a.owners):
        note = "" if owner.owns_file in (True, None) else " (does not list this file in RECORD)"
        lines.append(f"{'owner' if i == 0 else 'also'}   {owner.name} {owner.version}{note}")
    if a.attr:
        if a.attr_found:
            lines.append(f"attr    {a.attr}: present, {a.attr_type} = {a.attr_repr}")
        elif a.attr_error:
            lines.append(f"attr    {a.attr}: absent ({a.attr_error})")
    lines.append(f"python  {a.python} ({a.python_version})")
    error = ""
    if not a.imported:
        # The frames that led to the error; the error itself is already on the first line.
        frames = [line for line in a.traceback if line.strip() and not line.startswith("Traceback")]
        if frames and frames[-1] == f"{a.error_type}: {a.error}":
            frames.pop()
        error = "\n".join(frames[-6:])
    return "\n".join(lines), error


def _print_http(results: dict[str, HostResult[http_core.HttpAnswer]], request: http_core.HttpRequest) -> None:
    rows = []
    for name, res in sorted(results.items()):
        a = res.value
        if a is None:
            rows.append([name, render.status_text(res), "", "", "", res.reason])
            continue
        ms = f"{a.latency_ms:.1f}" if a.latency_ms is not None and a.status is not None else ""
        path = a.path + (" (fallback)" if a.fell_back else "")
        rows.append([name, a.got, ms, path, a.content_type or "", a.error or a.json_error or ""])
    out = render.console()
    out.print(render.table(f"GET {request.path}", ["host", "status", "ms", "path", "content type", "note"], rows))
    answered = {n: r.value for n, r in results.items() if r.value is not None and r.value.status is not None}
    if request.fields and answered:
        # One row per field: a value all hosts share is shown once, differences by host (like facts).
        field_rows = [[f, render.gathered({n: _field_cell(a, f) for n, a in answered.items()})]
                      for f in request.fields]
        out.print(render.table(None, ["field", "value"], field_rows))
    elif answered:
        bodies = {n: r for n, r in results.items() if n in answered}
        render.print_blocks([b for b in _blocks(bodies, _http_body) if b.stdout])
    render.print_failures(results)
    out.print(render.summary_line(results))


def _field_cell(a: http_core.HttpAnswer, path: str) -> str:
    if path not in a.fields:
        return "(missing)" if a.has_json else "(no JSON)"
    value = a.fields[path]
    return value if isinstance(value, str) else json.dumps(value)


def _http_body(a: http_core.HttpAnswer) -> tuple[str, str]:
    if a.has_json:
        return json.dumps(a.body, indent=2, sort_keys=True), ""
    text = (a.text or "").rstrip("\n")
    return text + ("\n... (truncated)" if a.truncated and text else ""), ""
