"""``loop`` / ``with_items`` with ``loop_control``: one task run once per item, on each host.

As Ansible: the list is a YAML list or a template giving one (``with_items`` flattens one level);
each item is ``item`` (or ``loop_control.loop_var``), its position ``index_var`` when asked; ``when``
and ``until`` are evaluated per item. The task's result: changed when an item changed, failed when
one failed (the others still run), skipped when every item was (or the list is empty);
``register`` gives ``results`` (each item's result with ``item``). ``loop_control.label`` is what
the output shows for an item (default: the item).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleetctl import templating
from fleetctl.errors import InputError
from fleetctl.playbook.modules import TaskResult
from fleetctl.playbook.schema import LoopControl, Task

MAX_LABEL = 80


def loop_items(task: Task, variables: dict[str, Any], where: str) -> list[Any]:
    raw = task.options.loop_items
    key = "loop" if task.options.loop is not None else "with_items"
    try:
        value = templating.render(raw, variables)
    except templating.TemplateProblem as exc:
        raise InputError(f"{where}: {key}: {exc}") from None
    if isinstance(value, str) and key == "with_items":
        value = [value]
    if not isinstance(value, list):
        raise InputError(f"{where}: {key}: expects a list, got {type(value).__name__} {str(value)[:60]!r}")
    if key == "with_items":
        value = [x for v in value for x in (v if isinstance(v, list) else [v])]
    return value


def task_vars(task: Task, variables: dict[str, Any], where: str) -> dict[str, Any]:
    """The task's own ``vars``, rendered in order (each may use the ones before it)."""
    scope = dict(variables)
    out: dict[str, Any] = {}
    for key, value in task.options.vars.items():
        try:
            out[key] = scope[key] = templating.render(value, scope)
        except templating.TemplateProblem as exc:
            raise InputError(f"{where}: vars.{key}: {exc}") from None
    return out


def _label(ctl: LoopControl, item: Any, variables: dict[str, Any]) -> str:
    if ctl.label is None:
        text = str(item)
    else:
        try:
            text = str(templating.render(ctl.label, variables))
        except templating.TemplateProblem:
            text = str(item)
    return text if len(text) <= MAX_LABEL else text[:MAX_LABEL - 3] + "..."


def run_loop(task: Task, variables: dict[str, Any], where: str,
             run_item: Callable[[dict[str, Any]], TaskResult]) -> TaskResult:
    """``run_item`` (when, module, until, changed_when/failed_when) once per item; one result."""
    ctl = task.options.loop_control or LoopControl()
    items = loop_items(task, variables, where)
    results: list[dict[str, Any]] = []
    done: list[tuple[str, TaskResult]] = []
    out = TaskResult()
    for n, item in enumerate(items):
        scope = {**variables, ctl.loop_var: item, "ansible_loop_var": ctl.loop_var}
        if ctl.index_var:
            scope[ctl.index_var] = n
        res = run_item(scope)
        label = _label(ctl, item, scope)
        done.append((label, res))
        entry = {**res.as_var(), ctl.loop_var: item, "item": item, "ansible_loop_var": ctl.loop_var}
        if ctl.index_var:
            entry[ctl.index_var] = n
        results.append(entry)
        out.set_vars.update(res.set_vars)
    out.changed = any(r.changed for _, r in done)
    out.failed = any(r.failed for _, r in done)
    out.skipped = all(r.skipped for _, r in done)
    out.diff = "".join(r.diff for _, r in done)
    out.data = {"results": results}
    bad = [(label, r) for label, r in done if r.failed]
    if not items:
        out.msg = "no items in the list"
    elif bad:
        out.msg = "one or more items failed: " + "; ".join(f"({label}) {r.msg}" for label, r in bad[:3])
    else:
        out.msg = "; ".join(f"({label}) {r.msg}" if r.msg else f"({label})" for label, r in done[:5]) + \
            (f"; ... {len(done) - 5} more" if len(done) > 5 else "")
    return out
