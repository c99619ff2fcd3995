"""Run a playbook: plays in order, each play's hosts in ``serial`` batches, tasks in order per batch.

Within a batch each task runs on every host still going, in parallel (Ansible's linear strategy);
a host that fails drops out of the play. After each batch the failures are counted against the
play's budgets; when one is exceeded the rollout stops before the next batch and ``on_failure``
applies: ``halt`` leaves hosts as they are, ``rollback_failed`` / ``rollback_all`` switch hosts
back to the release recorded for them when the rollout first started. ``stop()`` (Ctrl-C) lets
the tasks in flight finish, launches nothing new, and records where it stopped; ``--resume``
skips the hosts that finished. Every step is an event in the journal and for the printer.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from fleetctl import yamlfile
from fleetctl.errors import FleetError, HostError, InputError
from fleetctl.inventory import Inventory
from fleetctl.playbook import journal as journal_mod
from fleetctl.playbook import rollout, templating
from fleetctl.playbook.modules import ModuleContext, RunServices, TaskResult
from fleetctl.playbook.schema import Play, Playbook, Task
from fleetctl.transport.base import HostResult, Status
from fleetctl.transport.fleet import Fleet, HostContext, RunSettings
from fleetctl.vault import Vault

Listener = Callable[[str, dict[str, Any]], None]
RECAP_KEYS = ("ok", "changed", "failed", "unreachable", "skipped", "ignored", "rolled_back")


@dataclass
class RunOptions:
    check: bool = False
    diff: bool = False
    tags: frozenset[str] = frozenset()
    skip_tags: frozenset[str] = frozenset()
    start_at_task: str | None = None
    limit: str | None = None
    extra_vars: dict[str, Any] = field(default_factory=dict)
    resume_events: list[dict[str, Any]] | None = None  # the journal of the run being resumed
    rollback_timeout: float = 300.0
    command: str = "fleetctl run"
    vault: Vault | None = None  # --vault-password-file / --vault-id: encrypted copy sources


T = TypeVar("T")


class PlaybookStopped(Exception):
    """Internal: a budget was exceeded or the run was interrupted; no later batch or play runs."""


class _HostVars(Mapping[str, Any]):
    """``hostvars``: every host's variables, registered results included, computed on access."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner

    def __getitem__(self, name: str) -> Any:
        ctx = self._runner.fleet.contexts.get(name)
        if ctx is None:
            host = self._runner.inventory.hosts.get(name)
            if host is None:
                raise KeyError(name)
            return dict(host.vars)
        return {**ctx.vars, **self._runner.registered.get(name, {})}

    def __iter__(self) -> Iterator[str]:
        return iter(self._runner.inventory.hosts)

    def __len__(self) -> int:
        return len(self._runner.inventory.hosts)


class Runner:
    def __init__(self, inventory: Inventory, playbook: Playbook, options: RunOptions, settings: RunSettings,
                 journal: journal_mod.Journal, listener: Listener | None = None) -> None:
        from fleetctl.release.deploy import who

        self.inventory = inventory
        self.playbook = playbook
        self.options = options
        self.journal = journal
        self.listener = listener
        self.fleet = Fleet(inventory, [], settings)
        self.holder = who(options.command)
        self.services = RunServices(inventory, settings, self.holder, templating.render_text, templating.evaluate,
                                    self.fleet.contexts, options.vault)
        self.registered: dict[str, dict[str, Any]] = {}
        self.recap: dict[str, Counter[str]] = {}
        self.results: dict[str, list[dict[str, Any]]] = {}  # per host, for --json
        self.status = "ok"
        self._stop = threading.Event()
        self._groups: dict[str, list[str]] = {"all": list(inventory.hosts)}
        for host in inventory.hosts.values():
            for group in host.groups:
                self._groups.setdefault(group, []).append(host.name)
        self._start_at = options.start_at_task

    # -- control -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ctrl-C: finish what is in flight, launch nothing new."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def emit(self, kind: str, **fields: Any) -> None:
        shown = self.journal.event(kind, **fields)
        if self.listener:
            self.listener(kind, shown)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> int:
        resumed = self.options.resume_events
        self.emit("resume" if resumed else "run_start", playbook=str(self.playbook.path), digest=self.playbook.digest,
                  check=self.options.check, limit=self.options.limit, tags=sorted(self.options.tags),
                  extra_vars=self.options.extra_vars, who=self.holder, run_id=self.journal.run_id)
        try:
            for play in self.playbook.plays:
                self.run_play(play)
        except PlaybookStopped:
            pass
        except FleetError as exc:  # bad input met mid-run (a play's vars): the journal still says how it ended
            self.status = "error"
            self.emit("run_end", status=self.status, error=str(exc), recap=self._recap())
            raise
        finally:
            self.services.close()
            self.fleet.close()
        code = self.exit_code()
        self.emit("run_end", status=self.status, exit_code=code, recap=self._recap())
        return code

    def _recap(self) -> dict[str, dict[str, int]]:
        return {h: dict(c) for h, c in self.recap.items()}

    def exit_code(self) -> int:
        if self.status == "interrupted":
            return 130
        if self.status in ("halted", "failed"):
            return 2
        if any(c["failed"] or c["unreachable"] for c in self.recap.values()):
            self.status = "failed"
            return 2
        return 0

    def play_hosts(self, play: Play) -> list[str]:
        pattern = templating.render(play.model.hosts, self.options.extra_vars)
        names = [h.name for h in self.inventory.select(str(pattern))]
        if self.options.limit:
            allowed = {h.name for h in self.inventory.select(self.options.limit)}
            names = [n for n in names if n in allowed]
        return names

    def run_play(self, play: Play) -> None:
        tasks = self.selected_tasks(play)
        hosts = self.play_hosts(play)
        done = journal_mod.finished_hosts(self.options.resume_events or []).get(play.index, set())
        skipped = [h for h in hosts if h in done]
        hosts = [h for h in hosts if h not in done]
        model = play.model
        self.emit("play_start", play=play.index, name=play.name, hosts=hosts, finished_before=skipped,
                  serial=model.serial, on_failure=model.on_failure, tasks=len(tasks))
        if not hosts or not tasks:
            self.emit("play_end", play=play.index, name=play.name)
            return
        self.open_hosts(play, hosts)
        recorded = self.record_releases(play, hosts) if play.has_module("release") else {}
        budget = rollout.Budget(model.max_fail_percentage, model.max_failures, model.any_errors_fatal)
        plan = rollout.batches(hosts, model.serial)
        attempted: list[str] = []
        failed_total: list[str] = []
        for b, batch in enumerate(plan):
            if b and model.pause_between_batches:
                self._stop.wait(model.pause_between_batches)
            if self.stopping:
                self.interrupted(play, b + 1, None, [h for bb in plan[b:] for h in bb])
            self.emit("batch_start", play=play.index, batch=b + 1, batches=len(plan), hosts=batch)
            attempted += batch
            failed = self.run_batch(play, tasks, b, batch)
            failed_total += failed
            why = budget.exceeded(len(failed), len(batch), len(failed_total))
            self.emit("batch_end", play=play.index, batch=b + 1, failed=failed)
            if why:
                left = [h for bb in plan[b + 1:] for h in bb]
                self.emit("halted", play=play.index, batch=b + 1, why=why, on_failure=model.on_failure,
                          not_started=left)
                self.status = "halted"
                self.on_failure(play, recorded, attempted, failed_total)
                raise PlaybookStopped
        self.emit("play_end", play=play.index, name=play.name)

    def interrupted(self, play: Play, batch: int, task: Task | None, pending: list[str]) -> None:
        self.status = "interrupted"
        self.emit("interrupted", play=play.index, batch=batch, task=task.name if task else None, pending=pending)
        raise PlaybookStopped

    def selected_tasks(self, play: Play) -> list[Task]:
        out = []
        for task in play.tasks:
            if self._start_at:
                if task.name != self._start_at:
                    continue
                self._start_at = None
            tags = set(task.options.tags)
            if self.options.tags and not (tags & self.options.tags or "always" in tags):
                continue
            if tags & self.options.skip_tags:
                continue
            out.append(task)
        return out

    def open_hosts(self, play: Play, hosts: list[str]) -> None:
        """Each host's variables for this play: inventory < play vars < extra vars (-e)."""
        for name in hosts:
            ctx = self.services.session(name)
            base = {**self.inventory.hosts[name].vars}
            for key, value in play.model.vars.items():
                try:
                    base[key] = templating.render(value, {**base, **self.options.extra_vars})
                except templating.TemplateProblem as exc:
                    raise InputError(f"{self.playbook.path}:{play.line}: vars.{key}: {exc} (host {name})") from None
            ctx.vars = {**base, **self.options.extra_vars}
            self.recap.setdefault(name, Counter({k: 0 for k in RECAP_KEYS}))
            self.registered.setdefault(name, {})

    # -- batches and tasks --------------------------------------------------------------------------

    def run_batch(self, play: Play, tasks: list[Task], b: int, batch: list[str]) -> list[str]:
        """Every task on the batch's hosts; the hosts that failed (unreachable included)."""
        active = list(batch)
        failed: list[str] = []
        for task in tasks:
            if not active:
                break
            if self.stopping:
                self._finish_hosts(play, active, failed)
                self.interrupted(play, b + 1, task, active + [h for h in batch if h not in active and h not in failed])
            self.emit("task_start", play=play.index, task=task.index, name=task.name, module=task.module.name,
                      hosts=active, batch=b + 1)
            results = self.fleet.map(partial(self.run_task, play, task, batch=batch), names=active)
            for host, res in results.items():
                status = self.account(play, task, host, res)
                if status in ("failed", "unreachable"):
                    active.remove(host)
                    failed.append(host)
            if failed and play.model.any_errors_fatal:
                break
        self._finish_hosts(play, active, failed)
        return failed

    def _finish_hosts(self, play: Play, active: list[str], failed: list[str]) -> None:
        for host in failed:
            self.emit("host_done", play=play.index, host=host, status="failed")
        if not self.stopping:
            for host in active:
                self.emit("host_done", play=play.index, host=host, status="ok")

    def account(self, play: Play, task: Task, host: str, res: HostResult[TaskResult]) -> str:
        """Count one host's result in the recap, register it, emit it; its status word."""
        result = res.value if res.ok and res.value is not None else None
        if res.status is Status.UNREACHABLE:
            status, msg = "unreachable", res.reason
        elif result is None:
            status, msg = ("ignored" if task.options.ignore_errors else "failed"), res.reason
        elif result.failed:
            status, msg = ("ignored" if task.options.ignore_errors else "failed"), result.msg
        elif result.skipped:
            status, msg = "skipped", result.msg
        else:
            status, msg = ("changed" if result.changed else "ok"), result.msg
        reg = task.options.register_as
        if reg and status != "unreachable":
            self.registered[host][reg] = result.as_var() if result else {"failed": True, "changed": False,
                                                                            "skipped": False, "msg": msg}
        if result and result.set_vars:
            self.registered[host].update(result.set_vars)
        counter = self.recap[host]
        counter["ok" if status in ("ok", "changed") else status] += 1
        if status == "changed":
            counter["changed"] += 1
        if result and result.rolled_back:
            counter["rolled_back"] += 1
        entry = {"play": play.index, "task": task.index, "name": task.name, "host": host, "status": status,
                 "msg": msg, "changed": bool(result and result.changed), "rolled_back": bool(result and
                                                                                            result.rolled_back)}
        if result and result.release:
            entry["release"] = result.release
        if result and result.diff and self.options.diff:
            entry["diff"] = result.diff
        if result and result.data:
            entry["data"] = result.data
        self.results.setdefault(host, []).append(self.journal.redact(entry))
        self.emit("task_result", **entry)
        return status

    def task_vars(self, ctx: HostContext, batch: list[str]) -> dict[str, Any]:
        return {**ctx.vars, **self.registered.get(ctx.name, {}), **self.options.extra_vars,
                "inventory_hostname": ctx.name, "groups": self._groups, "hostvars": _HostVars(self),
                "batch_hosts": list(batch), "check_mode": self.options.check}

    def run_task(self, play: Play, task: Task, ctx: HostContext, batch: list[str]) -> TaskResult:
        """One task on one host (in a worker thread): when, render, validate, run, retry until."""
        where = f"{self.playbook.path}:{task.line}"
        variables = self.task_vars(ctx, batch)
        try:
            for cond in task.when:
                if not templating.truthy(templating.evaluate(cond, variables)):
                    return TaskResult(skipped=True, msg=f"condition false: {cond}")
        except templating.TemplateProblem as exc:
            raise InputError(f"{where}: when: {exc}") from None
        until, reg = task.options.until, task.options.register_as
        attempts = task.options.retries + 1 if until else 1
        result = TaskResult()
        for attempt in range(1, attempts + 1):
            result = self.call_module(task, ctx, variables, where)
            if until is None or reg is None:
                return result
            variables[reg] = result.as_var()
            try:
                if templating.truthy(templating.evaluate(until, variables)):
                    return result
            except templating.TemplateProblem as exc:
                raise InputError(f"{where}: until: {exc}") from None
            if attempt < attempts:
                time.sleep(task.options.delay)
        result.failed = True
        result.msg = f"until {until!r} still false after {attempts} attempts" + (f": {result.msg}" if result.msg
                                                                                 else "")
        return result

    def call_module(self, task: Task, ctx: HostContext, variables: dict[str, Any], where: str) -> TaskResult:
        play = self.playbook.plays[task.play].model  # a task's become keyword beats its play's
        become = task.options.become if task.options.become is not None else play.become
        user = task.options.become_user or play.become_user
        if become is not None or user is not None:
            ctx = self.services.session_as(ctx.name, become, user)
        try:
            raw = templating.render(task.args, variables)
        except templating.TemplateProblem as exc:
            raise InputError(f"{where}: {task.module.name}: {exc}") from None
        try:
            args = task.module.args.model_validate(raw)
        except ValidationError as exc:
            doc = yamlfile.YamlDoc(self.playbook.path, raw, start_line=task.line)
            raise yamlfile.first_error(doc, (), exc, prefix=f"{task.module.name}.") from None
        mc = ModuleContext(ctx, variables, self.options.check, self.options.diff, self.playbook.path.parent,
                           self.services)
        return task.module.fn(mc, args)

    # -- releases: recorded before, rolled back on failure ------------------------------------------

    def as_release(self, play: Play, fn: Callable[[HostContext], T]) -> Callable[[HostContext], T]:
        """``fn`` on the session the play's release task runs under (its become keyword, else the
        play's): what a rollback writes needs the privileges the deploy had."""
        task = next((t for t in play.tasks if t.module.name == "release"), None)
        become = task.options.become if task and task.options.become is not None else play.model.become
        user = (task.options.become_user if task else None) or play.model.become_user
        return lambda ctx: fn(self.services.session_as(ctx.name, become, user))

    def record_releases(self, play: Play, hosts: list[str]) -> dict[str, str | None]:
        """The release each host runs before this rollout (from the resumed run's journal when it
        recorded the host: a resumed rollout still rolls back to what ran before it first started)."""
        from fleetctl.playbook.modules.release import current_release

        before = journal_mod.recorded_releases(self.options.resume_events or []).get(play.index, {})
        missing = [h for h in hosts if h not in before]
        found = self.fleet.map(self.as_release(play, current_release), names=missing) if missing else {}
        recorded = {**before, **{h: r.value for h, r in found.items() if r.ok}}
        # A host not reached is not recorded, so a resumed run asks it again.
        self.emit("recorded", play=play.index, releases={h: recorded[h] for h in hosts if h in recorded},
                  unreachable={h: r.reason for h, r in found.items() if not r.ok})
        return recorded

    def on_failure(self, play: Play, recorded: dict[str, str | None], attempted: list[str], failed: list[str]) -> None:
        how = play.model.on_failure
        if how == "halt":
            return
        targets = failed if how == "rollback_failed" else attempted
        if self.options.check:
            self.emit("rollback", play=play.index, hosts=targets, status="skipped", msg="check mode: nothing to undo")
            return
        from fleetctl.release.manage import rollback_host

        def back(ctx: HostContext) -> tuple[str, str]:
            to = recorded.get(ctx.name)
            if not to:
                return "ok", "no release recorded before this rollout: left as it is"
            outcome = rollback_host(ctx, to, self.options.rollback_timeout, self.holder)
            if not outcome.ok:
                raise HostError(ctx.name, "rollback: " + "; ".join(g.detail for g in outcome.gates if not g.ok))
            status = "rolled-back" if outcome.outcome == "rolled-back" else "ok"
            return status, f"{outcome.outcome}: {outcome.from_id or '-'} -> {outcome.to_id}"

        results = self.fleet.map(self.as_release(play, back), names=targets)
        for host, res in results.items():
            status, msg = res.value if res.ok and res.value else (res.status.value, res.reason)
            if status == "rolled-back":
                self.recap[host]["rolled_back"] += 1
            self.emit("rollback", play=play.index, host=host, to=recorded.get(host), status=status, msg=msg)



def load_resume(folder: Path, run_id: str) -> list[dict[str, Any]]:
    return journal_mod.read_events(journal_mod.find_run(folder, run_id))
