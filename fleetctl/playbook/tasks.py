"""One task on one host, as the runner runs it: its variables (``hostvars`` computed on access), ``when``,
a loop's items, rendering, the module's argument check, ``until`` retries, become and ``delegate_to``,
``async``. ``Runner`` has these steps from ``TaskRunner``; the batches and plays are ``runner.py``'s."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from fleetctl import templating, yamlfile
from fleetctl.errors import InputError
from fleetctl.playbook import loops, outcome
from fleetctl.playbook.delegation import Delegation
from fleetctl.playbook.modules import ModuleContext, RunServices, TaskResult, asyncjobs
from fleetctl.playbook.play_schema import Play, Playbook
from fleetctl.playbook.schema import Task
from fleetctl.playbook.state import RunOptions
from fleetctl.runs import journal as journal_mod
from fleetctl.templating import filters

if TYPE_CHECKING:
    from fleetctl.inventory import Inventory
    from fleetctl.transport.fleet import Fleet, HostContext


class _HostVars(Mapping[str, Any]):
    """``hostvars``: every host's variables, registered results included, computed on access."""

    def __init__(self, runner: TaskRunner) -> None:
        self._runner = runner

    def __getitem__(self, name: str) -> Any:
        ctx = self._runner.fleet.contexts.get(name)
        if ctx is None:
            host = self._runner.inventory.hosts.get(name)
            if host is None:
                raise KeyError(name)
            return templating.LazyVars(dict(host.vars))
        return templating.LazyVars({**ctx.vars, **self._runner.registered.get(name, {})})

    def __iter__(self) -> Iterator[str]:
        return iter(self._runner.inventory.hosts)

    def __len__(self) -> int:
        return len(self._runner.inventory.hosts)


class TaskRunner:
    """The task steps of a run; the runner sets these attributes."""

    inventory: Inventory
    playbook: Playbook
    options: RunOptions
    journal: journal_mod.Journal
    fleet: Fleet
    services: RunServices
    delegation: Delegation
    registered: dict[str, dict[str, Any]]
    _groups: dict[str, list[str]]

    def task_vars(self, ctx: HostContext, batch: list[str]) -> dict[str, Any]:
        return {**ctx.vars, **self.registered.get(ctx.name, {}), **self.options.extra_vars,
                "inventory_hostname": ctx.name, "groups": self._groups, "hostvars": _HostVars(self),
                "batch_hosts": list(batch), "check_mode": self.options.check, "omit": filters.OMIT,
                "playbook_dir": str(self.playbook.path.parent.resolve()), "__vault": self.services.vault,
                "__redact": self.journal.redact}

    def run_task(self, play: Play, task: Task, ctx: HostContext, batch: list[str]) -> TaskResult:
        """One task on one host (in a worker thread): once, or once per item of its loop."""
        where = task.where(self.playbook.path)
        variables = self.task_vars(ctx, batch)
        if task.role_dir:
            variables["role_path"] = str(task.role_dir)
        variables.update(loops.task_vars(task, variables, where))
        if task.options.loop_items is not None:
            return loops.run_loop(task, variables, where, partial(self.run_item, task, ctx, where=where))
        return self.run_item(task, ctx, variables, where)

    def run_item(self, task: Task, ctx: HostContext, variables: dict[str, Any], where: str) -> TaskResult:
        """when, render, validate, run, retry until."""
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
            variables[reg] = templating.unsafe(result.as_var())
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
        if task.options.delegate_to:  # that host's connection, this host's variables
            try:
                to = str(templating.render(task.options.delegate_to, variables))
            except templating.TemplateProblem as exc:
                raise InputError(f"{where}: delegate_to: {exc}") from None
            ctx = self.delegation.session(to, become, user)
        elif become is not None or user is not None:
            ctx = self.services.session_as(ctx.name, become, user)
        try:
            raw = filters.strip_omitted(templating.render(task.args, variables))
            env = {k: str(v) for k, v in templating.render(task.options.environment, variables).items()}
        except templating.TemplateProblem as exc:
            raise InputError(f"{where}: {task.module.name}: {exc}") from None
        try:
            args = task.module.args.model_validate(raw)
        except ValidationError as exc:
            doc = yamlfile.YamlDoc(task.source or self.playbook.path, raw, start_line=task.line)
            raise yamlfile.first_error(doc, (), exc, prefix=f"{task.module.name}.") from None
        check = self.options.check if task.options.check_mode is None else task.options.check_mode
        mc = ModuleContext(ctx, variables, check, self.options.diff, self.playbook.path.parent,
                           self.services, env, task.role_dir)
        if task.options.async_:  # a detached host job (modules/asyncjobs.py)
            done = asyncjobs.run_async(mc, task.module, args, task.options.async_, task.options.poll)
            return outcome.apply(task, variables, done, where)
        return outcome.apply(task, variables, task.module.fn(mc, args), where)
