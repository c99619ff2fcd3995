"""Handlers: tasks that run only when notified, once, after the tasks that notified them.

As Ansible: a task with ``notify: NAME`` (or a list) notifies the handlers whose ``name`` or
``listen`` is NAME on each host where it *changed*. Handlers run at the flush points of the play
(after ``pre_tasks``, after the roles and ``tasks``, after ``post_tasks``, and at a
``meta: flush_handlers`` task): each notified handler once per host, in the order the handlers are
defined (roles' handlers first), on the hosts still going (a host that failed runs none). A
handler may notify a later one. A notify naming no handler of the play is refused when the
playbook loads, naming the task's file:line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetctl import yamlfile
from fleetctl.errors import InputError
from fleetctl.playbook import fqcn
from fleetctl.playbook.schema import Task, parse_task

FLUSH = "flush_handlers"


@dataclass
class Flush:
    """A flush point: the play's handlers (filled once they are all parsed), run for the notified."""

    handlers: list[Task]
    line: int
    name: str = "flush handlers"


def parse_handlers(doc: yamlfile.YamlDoc, at: tuple[Any, ...], raw: list[Any], flat: list[Task]) -> list[Task]:
    """The ``handlers`` list: plain tasks (``listen`` allowed), no blocks."""
    out = []
    for j, item in enumerate(raw):
        item = fqcn.normalize(doc, (*at, j), item)
        if isinstance(item, dict) and ("block" in item or "include_tasks" in item or "import_tasks" in item):
            key = next(k for k in ("block", "include_tasks", "import_tasks") if k in item)
            raise doc.error((*at, j, key), f"{key}: not supported in a handler (a handler is one task)")
        task = parse_task(doc, (*at, j), item, len(flat), {"handler": True})
        flat.append(task)
        out.append(task)
    return out


def names_of(handler: Task) -> set[str]:
    return {n for n in (handler.options.name, *handler.options.listen) if n}


def check_notified(tasks: list[Task], handlers: list[Task], doc: yamlfile.YamlDoc) -> None:
    known = set().union(*(names_of(h) for h in handlers)) if handlers else set()
    for task in tasks:
        for name in task.options.notify:
            if name not in known:
                where = f"{task.source or doc.path}:{task.line}"
                raise InputError(f"{where}: notify: no handler named {name!r} in this play"
                                          + (f" (handlers: {', '.join(sorted(known))})" if known else ""))


@dataclass
class Notifications:
    """Which handlers each host has been notified to run (by handler task index)."""

    pending: dict[str, set[int]] = field(default_factory=dict)

    def note(self, host: str, task: Task, handlers: list[Task]) -> None:
        for name in task.options.notify:
            for handler in handlers:
                if name in names_of(handler):
                    self.pending.setdefault(host, set()).add(handler.index)

    def run(self, flush: Flush, active: list[str], failed: list[str],
            run_task: Callable[[Task, list[str]], list[str]]) -> None:
        """Each handler, in definition order, on the active hosts notified for it."""
        for handler in flush.handlers:
            hosts = [h for h in active if handler.index in self.pending.get(h, set())]
            if not hosts:
                continue
            for host in hosts:
                self.pending[host].discard(handler.index)
            for host in run_task(handler, hosts):
                active.remove(host)
                failed.append(host)


def attach(items: list[Any], play_handlers: list[Task]) -> None:
    """Give every flush point of the play (``meta: flush_handlers`` ones too, in blocks) its handlers."""
    for item in items:
        if isinstance(item, Flush):
            item.handlers = play_handlers
        for part in ("block", "rescue", "always"):
            attach(getattr(item, part, None) or [], play_handlers)
