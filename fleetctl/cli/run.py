"""``fleetctl run PLAYBOOK`` (plays, rollout in batches, budgets, rollback, journal; ``--step``,
``--events``) and ``fleetctl runs list|show|promote|abort`` (the journals of runs, their gates)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import click

from fleetctl import render
from fleetctl.cli import complete
from fleetctl.cli.context import AppContext
from fleetctl.cli.options import host_options, parse_extra_vars


def _split(values: tuple[str, ...]) -> frozenset[str]:
    return frozenset(t.strip() for v in values for t in v.split(",") if t.strip())


@click.command(name="run")
@click.argument("playbook_path", metavar="PLAYBOOK", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-e", "--extra-vars", "extra_vars", multiple=True, metavar="KEY=VALUE|@FILE",
              callback=parse_extra_vars, help="Variables that override every other (inventory, play vars).")
@click.option("--check", is_flag=True, help="Ask every module what it would change; change nothing.")
@click.option("--diff", "show_diff", is_flag=True, help="Show the text diffs of what changes (or would).")
@click.option("--tags", multiple=True, metavar="TAG[,TAG]", help="Only tasks with one of these tags (and 'always').")
@click.option("--skip-tags", multiple=True, metavar="TAG[,TAG]", help="Leave out tasks with these tags.")
@click.option("--start-at-task", metavar="NAME", help="Start at the first task of this name.")
@click.option("--resume", "resume", metavar="RUN_ID", shell_complete=complete.run_ids,
              help="Go on with a halted or interrupted run: "
              "hosts that finished it are skipped; rollbacks still go to what ran before it first started.")
@click.option("--rollback-timeout", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds a rollback (on_failure) waits for /health on each host.")
@click.option("--step", is_flag=True, help="Ask on the terminal before each batch: y (run it), n (stop the "
              "rollout here; on_failure applies), c (run the rest without asking).")
@click.option("--events", "events", is_flag=True, help="Print the journal's events to stdout as they happen, "
              "one JSON object per line (secrets masked); the human output goes to stderr.")
@click.option("--wait", type=click.FloatRange(0, 3600), default=0.0, metavar="SECONDS",
              help="A host another run holds when a release play starts: wait up to SECONDS for that run to end.")
@host_options
@click.pass_obj
def run(app: AppContext, playbook_path: Path, extra_vars: dict[str, Any], check: bool, show_diff: bool,
        tags: tuple[str, ...], skip_tags: tuple[str, ...], start_at_task: str | None, resume: str | None,
        rollback_timeout: float, step: bool, events: bool, wait: float) -> int:
    """Run PLAYBOOK: each play's hosts in `serial` batches (the first is the canary), failure budgets,
    `on_failure` rollback, a journal in .fleetctl/runs/ beside the inventory."""
    from fleetctl.cli.run_operator import operator_for
    from fleetctl.errors import InputError
    from fleetctl.playbook import approval
    from fleetctl.playbook.events import EventStream
    from fleetctl.playbook.plays import load_playbook
    from fleetctl.playbook.runner import Runner, RunOptions
    from fleetctl.runs import journal as jr

    app.extra_vars.update(extra_vars)
    if events and app.json:
        raise InputError("--events and --json both write to stdout: give one of them")
    playbook = load_playbook(playbook_path, app.vault)
    if start_at_task and not any(t.name == start_at_task for t in playbook.tasks()):
        raise InputError(f"{playbook_path}: --start-at-task {start_at_task!r}: no task has that name")
    _warn_unread(app.extra_vars, playbook_path, app.inventory.sources)  # -e before or after the command
    folder = jr.runs_dir(app.inventory.folder)
    before = _resumed(app, folder, resume, playbook_path) if resume else None
    inventory = app.inventory  # reloaded when the resumed run's own -l or -e differ
    redact = _redactor(app, inventory, playbook)
    printer = Printer(app.json, show_diff, to_stderr=events)
    operator = operator_for(playbook, step, printer.ask, printer.hold)
    if resume and not check:
        journal = jr.Journal.reopen(folder, resume, redact)
        approval.clear(journal.path)
    else:  # a checked resume plans from the run's journal but writes a journal of its own
        journal = jr.Journal.create(folder, playbook_path, redact)
    command = " ".join(["fleetctl run", str(playbook_path), *(["--check"] if check else [])])
    options = RunOptions(check=check, diff=show_diff, tags=_split(tags), skip_tags=_split(skip_tags),
                         start_at_task=start_at_task, limit=app.limit, extra_vars=dict(app.extra_vars),
                         resume_events=before, rollback_timeout=rollback_timeout, command=command,
                         vault=app.vault, operator=operator, wait=wait)
    if events:
        journal.tee = EventStream(sys.stdout)
    runner = Runner(inventory, playbook, options, app.run_settings(),
                    journal, printer.on_event)
    previous = _install_interrupt(runner, printer)
    try:
        with printer:
            code = runner.run()
    finally:
        signal.signal(signal.SIGINT, previous)
        journal.close()
    _report(app, printer, runner, journal, redact, playbook_path, code)
    return code


def _resumed(app: AppContext, folder: Path, resume: str, playbook_path: Path) -> list[dict[str, Any]]:
    """The resumed run's events; its own limit and -e, as journaled, put back (a contradiction is refused)."""
    from fleetctl.playbook.resumption import restored
    from fleetctl.runs import journal as jr

    before = jr.read_events(jr.find_run(folder, resume))
    first = next((e for e in before if e.get("event") == "run_start"), {})
    limit, variables = restored(resume, first, playbook_path, app.limit, app.extra_vars)
    if (limit, variables) != (app.limit, app.extra_vars):
        app.limit, app.extra_vars = limit, variables
        app.reload_inventory()
    return before


def _redactor(app: AppContext, inventory: Any, playbook: Any) -> Any:
    """Every secret the run may meet: the hosts' vault values (with -e: extra vars are merged into every
    host's vars), !vault values in the playbook (play vars, defaults, task arguments), -K's password."""
    from fleetctl.secrets import Redactor, vault_values

    redact = Redactor.for_hosts(h.vars for h in inventory.hosts.values())
    in_playbook = vault_values([*(p.vars for p in playbook.plays), *(p.defaults for p in playbook.plays),
                               *(t.args for t in playbook.tasks())])
    extra = [app.connect.become_password] if app.connect and app.connect.become_password else []
    return Redactor([*redact.values, *in_playbook, *extra])


def _report(app: AppContext, printer: Printer, runner: Any, journal: Any, redact: Any, playbook_path: Path,
            code: int) -> None:
    if app.json:
        render.emit_json({"run_id": journal.run_id, "journal": str(journal.path), "status": runner.status,
                          "exit_code": code, "recap": {h: dict(c) for h, c in runner.recap.items()},
                          "results": runner.results})
        return
    from fleetctl.playbook.resumption import command as resume_command

    masked = [k for k, v in app.extra_vars.items() if redact({"v": v})["v"] != v]
    printer.recap(runner.recap, runner.status, journal.run_id, journal.path,
                  resume=resume_command(list(app.inventory.sources), playbook_path, journal.run_id, masked))


def _warn_unread(given: dict[str, Any], playbook_path: Path, sources: Any) -> None:
    """One line before anything runs when an -e variable is read by nothing (a misspelled name
    would otherwise fall back to the playbook's default without a word)."""
    from fleetctl.playbook.unread_vars import unread_warning

    line = unread_warning(given, playbook_path, [Path(s) for s in sources])
    if line:
        click.echo(f"fleetctl: warning: {line}", err=True)


def _install_interrupt(runner: Any, printer: Printer) -> Any:
    """First Ctrl-C: finish the tasks in flight, start nothing new, record it. Second: abort, still
    recorded and consistent: the gates in flight end and their hosts go back to the release they ran
    (GNU timeout sends SIGINT twice). Third: leave at once."""
    presses = []

    def handler(signum: int, frame: FrameType | None) -> None:
        presses.append(signum)
        if len(presses) == 1:
            runner.stop()
            printer.say("[bold yellow]Ctrl-C: finishing the tasks in flight, starting nothing new "
                        "(Ctrl-C again to abort)[/]")
            return
        runner.abort()
        printer.say("[bold yellow]Ctrl-C again: aborting; the health gates in flight end now and their hosts go "
                    "back to the release they ran (a third Ctrl-C leaves at once: a host may be left switched and "
                    "not gated)[/]")
        signal.signal(signal.SIGINT, signal.default_int_handler)

    return signal.signal(signal.SIGINT, handler)


STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "red", "unreachable": "magenta", "skipped": "cyan",
                "ignored": "dim red", "rolled-back": "yellow"}


class Printer:
    """What a person watching sees: plays, batches, tasks, per-host results; a progress line on a
    terminal (batch, task, hosts done, elapsed), plain lines otherwise. Silent with --json."""

    def __init__(self, as_json: bool, show_diff: bool, to_stderr: bool = False) -> None:
        self.quiet = as_json
        self.show_diff = show_diff
        self.out = render.console(stderr=as_json or to_stderr)
        self.progress: Any = None
        self.bar: Any = None
        self.done = 0
        self.total = 0
        self.where = ""
        self.start = time.monotonic()

    def __enter__(self) -> Printer:
        if not self.quiet and self.out.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("hosts done"), TimeElapsedColumn(), console=self.out,
                                     transient=True)
            self.progress.start()
            self.bar = self.progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress:
            self.progress.stop()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """The progress line off the terminal while a question waits for its answer."""
        if self.progress:
            self.progress.stop()
        try:
            yield
        finally:
            if self.progress:
                self.progress.start()

    def ask(self, question: str) -> None:
        """A question (markup), shown even with --json: someone must see what is asked."""
        self.out.print(question, end="", highlight=False, soft_wrap=True)

    def say(self, text: str) -> None:
        """One line of markup (values escaped by the caller); never wrapped, so logs grep well."""
        if not self.quiet:
            self.out.print(text, highlight=False, soft_wrap=True)

    def line(self, text: Any) -> None:
        if not self.quiet:
            self.out.print(text, highlight=False, soft_wrap=True)

    def _update(self) -> None:
        if self.progress:
            self.progress.update(self.bar, description=self.where, completed=self.done, total=self.total or None)

    def on_event(self, kind: str, e: dict[str, Any]) -> None:
        handler = getattr(self, f"_on_{kind}", None)
        if handler:
            handler(e)
        self._update()

    def _on_run_start(self, e: dict[str, Any]) -> None:
        mode = " (check mode: nothing is changed)" if e.get("check") else ""
        self.line(render.cell(f"run {e['run_id']}: {e['playbook']}{mode}"))

    def _on_resume(self, e: dict[str, Any]) -> None:
        self.line(render.cell(f"resuming run {e['run_id']}: {e['playbook']}"))

    def _on_play_start(self, e: dict[str, Any]) -> None:
        self.total += len(e["hosts"])
        self.where = e["name"][:40]
        serial = f" · serial {e['serial']}" if e.get("serial") else ""
        before = f" · already finished: {', '.join(e['finished_before'])}" if e.get("finished_before") else ""
        hosts = ", ".join(e["hosts"]) or "no hosts left"
        self.say(f"\n[bold]PLAY \\[{_esc(e['name'])}][/] {hosts}{serial} · on_failure {e['on_failure']}{before}")

    def _on_recorded(self, e: dict[str, Any]) -> None:
        rel = ", ".join(f"{h}={r or 'none'}" for h, r in e["releases"].items())
        self.say(f"  [dim]releases before this rollout: {_esc(rel)}[/]")

    def _on_batch_start(self, e: dict[str, Any]) -> None:
        label = "canary" if e["batch"] == 1 and e["batches"] > 1 else f"batch {e['batch']}/{e['batches']}"
        self.where = f"{label}"
        self.say(f"[bold cyan]BATCH {e['batch']}/{e['batches']}[/] {', '.join(e['hosts'])}"
                 + (" (canary)" if label == "canary" else ""))

    def _on_task_start(self, e: dict[str, Any]) -> None:
        self.where = f"batch {e['batch']} · {e['name'][:40]}"
        self.say(f"  [bold]TASK[/] \\[{_esc(e['name'])}]")

    def _on_task_result(self, e: dict[str, Any]) -> None:
        status = e["status"]
        msg = f"  {_esc(str(e.get('msg') or ''))}" if e.get("msg") else ""
        self.say(f"    [{STATUS_STYLE.get(status, 'white')}]{status}[/]: {e['host']}{msg}")
        if self.show_diff and e.get("diff") and not self.quiet:
            render.print_diff(self.out, e["diff"])  # whole lines: a cropped service.command hides its args

    def _on_host_done(self, e: dict[str, Any]) -> None:
        self.done += 1

    def _on_halted(self, e: dict[str, Any]) -> None:
        left = f"; not started: {', '.join(e['not_started'])}" if e.get("not_started") else ""
        self.say(f"[bold red]HALTED[/] after batch {e['batch']}: {_esc(e['why'])}{left}; on_failure {e['on_failure']}")

    def _on_rollback(self, e: dict[str, Any]) -> None:
        hosts = e.get("host") or ", ".join(e.get("hosts") or [])
        self.say(f"    [{STATUS_STYLE.get(e['status'], 'white')}]rollback {e['status']}[/]: {hosts}  "
                 f"{_esc(str(e.get('msg') or ''))}")

    def _on_approval_wait(self, e: dict[str, Any]) -> None:
        self.where = f"waiting for approval before batch {e['batch']}"
        self.say(f"[bold yellow]WAITING[/] for approval before batch {e['batch']}/{e['batches']} "
                 f"({', '.join(e['hosts'])}): {_esc(e['promote'])} or {_esc(e['abort'])} "
                 f"(after {e['timeout']:g}s: {e['on_timeout']})")

    def _on_approval(self, e: dict[str, Any]) -> None:
        by = f" by {_esc(str(e['by']))}" if e.get("by") else ""
        self.say(f"  approval before batch {e['batch']}: [bold]{e['decision']}[/]{by} after {e['waited']:g}s")

    def _on_step(self, e: dict[str, Any]) -> None:
        self.say(f"  step: batch {e['batch']} ({', '.join(e['hosts'])}): {e['answer']}")

    def _on_interrupted(self, e: dict[str, Any]) -> None:
        at = f"in batch {e['batch']}, before task {e['task']!r}" if e.get("task") else f"before batch {e['batch']}"
        self.say(f"[bold yellow]INTERRUPTED[/] {_esc(at)}; not finished: {', '.join(e['pending']) or '-'}")

    def recap(self, recap: dict[str, Any], status: str, run_id: str, path: Path, resume: str | None = None) -> None:
        rows = [[h, *(str(c[k]) for k in ("ok", "changed", "failed", "unreachable", "skipped", "ignored",
                                          "rescued", "rolled_back"))] for h, c in sorted(recap.items())]
        self.out.print(render.table("recap", ["host", "ok", "changed", "failed", "unreachable", "skipped",
                                              "ignored", "rescued", "rolled back"], rows))
        stopped = status in ("halted", "interrupted")
        hint = f"; resume with: {resume or f'fleetctl run PLAYBOOK --resume {run_id}'}" if stopped else ""
        self.out.print(render.cell(f"run {run_id}: {status} · journal {path} (fleetctl runs show {run_id}){hint}"),
                       soft_wrap=True)


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)


@click.group()
def runs() -> None:
    """The journals of earlier `fleetctl run`s (in .fleetctl/runs/ beside the inventory)."""


@runs.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.pass_obj
def list_runs(app: AppContext, as_json: bool) -> int:
    """Every run: id, playbook, when, how it ended."""
    from fleetctl.runs import journal as jr

    found = jr.list_runs(jr.runs_dir(app.inventory.folder))
    if as_json or app.json:
        render.emit_json([s.to_dict() for s in found])
        return 0
    rows = [[s.run_id, s.playbook, _when(s.started), s.status + (" (check)" if s.check else ""), str(len(s.hosts))]
            for s in found]
    render.console().print(render.table(None, ["run", "playbook", "started", "status", "hosts"], rows))
    return 0


@runs.command(name="show")
@click.argument("run_id", shell_complete=complete.run_ids)
@click.option("--json", "as_json", is_flag=True, help="Print every event of the journal as JSON.")
@click.pass_obj
def show_run(app: AppContext, run_id: str, as_json: bool) -> int:
    """One run's events: batches, per-host task results, rollbacks, where it stopped; the recap."""
    from fleetctl.runs import journal as jr

    path = jr.find_run(jr.runs_dir(app.inventory.folder), run_id)
    events = jr.read_events(path)
    if as_json or app.json:
        render.emit_json(events)
        return 0
    printer = Printer(False, True)
    for e in events:
        printer.on_event(str(e.get("event")), e)
    summary = jr.summarize(path)
    if summary.recap:
        from collections import Counter

        printer.recap({h: Counter(c) for h, c in summary.recap.items()}, summary.status, summary.run_id, path)
    else:
        printer.say(f"run {summary.run_id}: {summary.status} (no end recorded: the controller stopped mid-run)")
    return 0


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"



from fleetctl.cli.run_operator import abort, promote  # noqa: E402  (registered on `runs`; no import cycle)

runs.add_command(promote)
runs.add_command(abort)
