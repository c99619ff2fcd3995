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
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from fleetctl import templating
from fleetctl.errors import FleetError, InputError
from fleetctl.inventory import Inventory
from fleetctl.playbook import (
    approval,
    blocks,
    capacity,
    groupstep,
    handlers,
    outcome,
    releases,
    tags,
)
from fleetctl.playbook.delegation import Delegation
from fleetctl.playbook.modules import RunServices, TaskResult
from fleetctl.playbook.play_schema import Play, Playbook
from fleetctl.playbook.schema import Task
from fleetctl.playbook.state import PlaybookStopped, Rollout, RunOptions
from fleetctl.playbook.tasks import TaskRunner
from fleetctl.release.batched import reachable_contexts
from fleetctl.release.ownership import RunClaims
from fleetctl.runs import journal as journal_mod
from fleetctl.runs import rollout
from fleetctl.transport.base import HostResult, Status
from fleetctl.transport.fleet import Fleet, HostContext, RunSettings

Listener = Callable[[str, dict[str, Any]], None]
RECAP_KEYS = ("ok", "changed", "failed", "unreachable", "skipped", "ignored", "rescued", "rolled_back")


T = TypeVar("T")


class Runner(TaskRunner):
    def __init__(self, inventory: Inventory, playbook: Playbook, options: RunOptions, settings: RunSettings,
                 journal: journal_mod.Journal, listener: Listener | None = None) -> None:
        from fleetctl.liveness import who

        self.inventory = inventory
        self.playbook = playbook
        self.options = options
        self.journal = journal
        self.listener = listener
        self.fleet = Fleet(inventory, [], settings)
        self.holder = who(options.command)
        self.services = RunServices(inventory, settings, self.holder, templating.render_text, templating.evaluate,
                                    self.fleet.contexts, options.vault)
        if not options.check:  # a real run owns the hosts of its release plays until it ends (ownership.py)
            self.services.claims = RunClaims(self.holder, wait=options.wait)
            self.services.claims.start(journal.run_id)
        self.registered: dict[str, dict[str, Any]] = {}
        self.recap: dict[str, Counter[str]] = {}
        self.results: dict[str, list[dict[str, Any]]] = {}  # per host, for --json
        self.status = "ok"
        self._stop = threading.Event()
        self._abort = self.services.abort  # a second Ctrl-C: the gates in flight end and their hosts roll back
        self.services.operator = options.operator.bound(self._stop)
        self._groups: dict[str, list[str]] = {"all": list(inventory.hosts)}
        for host in inventory.hosts.values():
            for group in host.groups:
                self._groups.setdefault(group, []).append(host.name)
        self._start_at = options.start_at_task
        self.failed_before: set[str] = set()  # hosts that failed a play: left out of the later ones
        self.deadline: float | None = None  # the play's progress_deadline (monotonic)
        self.delegation = Delegation(self.services)
        self.notifications = handlers.Notifications()

    # -- control -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ctrl-C: finish what is in flight, launch nothing new."""
        self._stop.set()

    def abort(self) -> None:
        """A second Ctrl-C: as ``stop``, and the health gates in flight end unjudged, so each of their
        hosts goes back to the release it ran (a host not yet switched is not switched); the run still
        ends recorded (interrupted, then run_end)."""
        self._abort.set()
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait(self, seconds: float) -> None:
        """Sleep (a pause between batches), ended early by Ctrl-C."""
        self._stop.wait(seconds)

    def emit(self, kind: str, **fields: Any) -> None:
        shown = self.journal.event(kind, **fields)
        if self.listener:
            self.listener(kind, shown)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> int:
        # A checked resume writes a journal of its own (cli/run.py): only a real one adds to the run's.
        resumed = bool(self.options.resume_events) and not self.options.check
        self.emit("resume" if resumed else "run_start", playbook=str(self.playbook.path), digest=self.playbook.digest,
                  check=self.options.check, limit=self.options.limit, tags=sorted(self.options.tags),
                  extra_vars=self.options.extra_vars, who=self.holder, run_id=self.journal.run_id)
        try:
            for play in self.playbook.plays:
                self.run_play(play)
        except PlaybookStopped:
            pass
        except KeyboardInterrupt:  # a third Ctrl-C: leave at once, but say so in the journal
            self.status = "aborted"
            self.emit("run_end", status=self.status, exit_code=130, recap=self._recap(),
                      error="left at once by a third Ctrl-C: a host in flight may be switched and not gated "
                            "(fleetctl status shows it; run --resume gates it)")
            raise
        except FleetError as exc:  # bad input met mid-run (a play's vars): the journal still says how it ended
            self.status = "error"
            if resumed and not any(sum(c.values()) for c in self.recap.values()):
                # a resume that ran no task on any host: the run's own verdict stands, its error beside it
                self.emit("resume_failed", error=str(exc))
            else:
                self.emit("run_end", status=self.status, error=str(exc), recap=self._recap())
            raise
        finally:
            if self.services.claims is not None:
                self.services.claims.release_all()
            self.delegation.close()
            self.services.close()
            self.fleet.close()
        code = self.exit_code()
        self.emit("run_end", status=self.status, exit_code=code, recap=self._recap())
        return code

    def _recap(self) -> dict[str, dict[str, int]]:
        return {h: dict(c) for h, c in self.recap.items()}

    def exit_code(self) -> int:
        if self.status in ("interrupted", "aborted"):
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
        items = self.selected_items(play)
        hosts = self.play_hosts(play)
        done = journal_mod.finished_hosts(self.options.resume_events or []).get(play.index, set())
        skipped = [h for h in hosts if h in done]
        left_out = [h for h in hosts if h in self.failed_before and h not in done]  # failed an earlier play
        hosts = [h for h in hosts if h not in done and h not in self.failed_before]
        model = play.model
        self.emit("play_start", play=play.index, name=play.name, hosts=hosts, finished_before=skipped,
                  left_out=left_out, serial=model.serial, on_failure=model.on_failure, tasks=blocks.count(items))
        if not hosts or not items:
            self.emit("play_end", play=play.index, name=play.name)
            return
        self.open_hosts(play, hosts)
        self.deadline = time.monotonic() + model.progress_deadline if model.progress_deadline else None
        recorded: dict[str, str | None] = {}
        if play.has_module("release"):  # taken for the run: a host another run holds fails here, untouched
            recorded, refused = releases.record_releases(self, play, hosts)
            hosts = releases.refuse_hosts(self, play, hosts, refused)
        group_of = rollout.group_of(self.fleet, model.serial_group_var)
        rollout_ = Rollout(play, rollout.batches(hosts, model.serial, group_of), recorded)
        for b, batch in enumerate(rollout_.plan):
            if b:
                capacity.between_batches(self, rollout_, b)
            approval.before_batch(self, rollout_, b)
            if self.stopping:
                self.interrupted(play, b + 1, None, [h for bb in rollout_.plan[b:] for h in bb])
            capacity.check_capacity(self, rollout_, b, hosts)
            self.emit("batch_start", play=play.index, batch=b + 1, batches=len(rollout_.plan), hosts=batch)
            rollout_.attempted += batch
            others = [h for h in hosts if h not in batch]  # a live canary's baseline hosts are among these
            for host in batch:
                self.fleet.contexts[host].peers = partial(reachable_contexts, self.fleet, others)
            try:
                failed = self.run_batch(play, items, b, batch)
            except capacity.DeadlineExceeded as exc:
                rollout_.failed += [h for h in batch if h not in rollout_.failed and self._failed_in(play, h)]
                self.halt(rollout_, b, exc.why)
            rollout_.failed += failed
            self.emit("batch_end", play=play.index, batch=b + 1, failed=failed)
            if self._abort.is_set():  # the operator's abort ended the gates (each such host went back): no verdict
                self.interrupted(play, b + 1, None, failed + [h for bb in rollout_.plan[b + 1:] for h in bb])
            why = rollout_.budget.exceeded(len(failed), len(batch), len(rollout_.failed))
            if why:
                self.halt(rollout_, b, why)
        capacity.after_last_batch(self, rollout_)
        self.failed_before |= set(rollout_.failed)
        self.emit("play_end", play=play.index, name=play.name)

    def _failed_in(self, play: Play, host: str) -> bool:
        return any(r["status"] in ("failed", "unreachable") and r["play"] == play.index
                   for r in self.results.get(host, []))

    def halt(self, ro: Rollout, b: int, why: str, before_batch: bool = False) -> None:
        """Stop the rollout after batch ``b`` (0-based; -1: before the first), ``on_failure`` applies."""
        play = ro.play
        left = [h for bb in ro.plan[b + 1:] for h in bb]
        self.emit("halted", play=play.index, batch=b + 1, why=why, on_failure=play.model.on_failure,
                  not_started=left)
        self.status = "halted"
        releases.on_failure(self, play, ro.recorded, ro.attempted, ro.failed, b)
        raise PlaybookStopped

    def interrupted(self, play: Play, batch: int, task: Task | None, pending: list[str]) -> None:
        self.status = "interrupted"
        self.emit("interrupted", play=play.index, batch=batch, task=task.name if task else None, pending=pending,
                  aborted=self._abort.is_set())
        raise PlaybookStopped

    def selected_items(self, play: Play) -> list[blocks.Item]:
        def keep(task: Task) -> bool:
            if self._start_at:
                if task.name != self._start_at:
                    return False
                self._start_at = None
            return tags.selected(task.options.tags, self.options.tags, self.options.skip_tags)

        return blocks.select(play.body, keep)

    def open_hosts(self, play: Play, hosts: list[str]) -> None:
        """Each host's variables for this play: inventory < play vars < extra vars (-e)."""
        for name in hosts:
            ctx = self.services.session(name)
            base = {**play.defaults, **self.inventory.hosts[name].vars}
            for key, value in play.vars.items():
                try:
                    base[key] = templating.render(value, {**base, **self.options.extra_vars})
                except templating.TemplateProblem as exc:
                    raise InputError(f"{play.source or self.playbook.path}:{play.line}: vars.{key}: {exc} "
                                     f"(host {name})") from None
            ctx.vars = {**base, **self.options.extra_vars}
            self.recap.setdefault(name, Counter({k: 0 for k in RECAP_KEYS}))
            self.registered.setdefault(name, {})

    # -- batches and tasks --------------------------------------------------------------------------

    def run_batch(self, play: Play, items: list[blocks.Item], b: int, batch: list[str]) -> list[str]:
        """Every item on the batch's hosts; the hosts that failed (unreachable included)."""
        active = list(batch)
        failed: list[str] = []
        executor = blocks.Executor(play, partial(self.run_task_on, play, b, batch), lambda: self.stopping,
                                   lambda h: not self.fleet.contexts[h].unreachable, self.forgive, self.notifications)
        try:
            executor.run(items, active, failed)
        except blocks.Interrupted as stop:
            self._finish_hosts(play, active, failed)
            self.interrupted(play, b + 1, stop.task, active + [h for h in batch if h not in active and h not in failed])
        self._finish_hosts(play, active, failed)
        return failed

    def forgive(self, host: str) -> None:
        """A host rescued by a block's ``rescue``: its failure is not counted."""
        self.recap[host]["failed"] -= 1
        self.recap[host]["rescued"] += 1

    def run_task_on(self, play: Play, b: int, batch: list[str], task: Task, hosts: list[str]) -> list[str]:
        """One task on ``hosts`` (once for all of them with run_once); the hosts that failed it."""
        self.emit("task_start", play=play.index, task=task.index, name=task.name, module=task.module.name,
                  hosts=hosts, batch=b + 1, delegate_to=task.options.delegate_to, run_once=task.options.run_once)
        on = hosts[:1] if task.options.run_once else hosts
        fn, order = groupstep.in_step(self, play, task, on, partial(self.run_task, play, task, batch=batch))
        results, stuck = capacity.run_hosts(self, task, fn, order)
        results = {h: results[h] for h in on if h in results}
        if task.options.run_once and results:
            results = dict.fromkeys(hosts, results[on[0]])
        failed = []
        for host, res in results.items():
            if self.account(play, task, host, res) in ("failed", "unreachable"):
                failed.append(host)
        if stuck:
            why = capacity.deadline_why(play, b + 1, task, stuck)
            for host in stuck:
                self.account(play, task, host, HostResult(host, Status.FAILED, reason=why))
                self.emit("host_done", play=play.index, host=host, status="failed")
            raise capacity.DeadlineExceeded(why)
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
            self.registered[host][reg] = templating.unsafe(result.as_var()) if result else {
                "failed": True, "changed": False, "skipped": False, "msg": msg}
        if result and result.set_vars:  # what a host answered (facts) is never rendered again, as Ansible
            self.registered[host].update(templating.unsafe(result.set_vars))
        if status == "changed" and task.options.notify:
            self.notifications.note(host, task, self.playbook.plays[task.play].handlers)
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
        if task.options.no_log:
            entry = outcome.hidden(entry)
        self.results.setdefault(host, []).append(self.journal.redact(entry))
        self.emit("task_result", **entry)
        return status

    def as_release(self, play: Play, fn: Callable[[HostContext], T]) -> Callable[[HostContext], T]:
        return releases.as_release(self, play, fn)


def load_resume(folder: Path, run_id: str) -> list[dict[str, Any]]:
    return journal_mod.read_events(journal_mod.find_run(folder, run_id))
