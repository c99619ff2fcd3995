"""``changed_when`` / ``failed_when`` (a task's verdict from conditions) and ``no_log``.

As Ansible: evaluated after the module ran (per item in a loop), with the task's own result under
its ``register`` name; a list is all of its conditions. ``changed_when: false`` makes a command
report ok; ``failed_when: result.rc not in [0, 1]`` decides failure from the result. A skipped
result is left as it is. ``no_log: true`` hides the task's message, data and diff from the output,
``--json`` and the journal (``register`` still holds the whole result, as Ansible).
"""

from __future__ import annotations

from typing import Any

from fleetctl import templating
from fleetctl.errors import InputError
from fleetctl.playbook.modules import TaskResult
from fleetctl.playbook.schema import Task

NO_LOG_MSG = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"


def _all(conds: list[bool | str], variables: dict[str, Any], where: str, key: str) -> bool:
    try:
        return all(templating.truthy(templating.evaluate(c, variables)) for c in conds)
    except templating.TemplateProblem as exc:
        raise InputError(f"{where}: {key}: {exc}") from None


def apply(task: Task, variables: dict[str, Any], result: TaskResult, where: str) -> TaskResult:
    changed, failed = task.options.changed_when_list, task.options.failed_when_list
    if result.skipped or not (changed or failed):
        return result
    scope = dict(variables)
    if task.options.register_as:
        scope[task.options.register_as] = result.as_var()
    if changed:
        result.changed = _all(changed, scope, where, "changed_when")
        if task.options.register_as:
            scope[task.options.register_as] = result.as_var()
    if failed:
        was = result.failed
        result.failed = _all(failed, scope, where, "failed_when")
        if result.failed and not was:
            result.msg = f"failed_when: {' and '.join(str(c) for c in failed)}" + (f" ({result.msg})"
                                                                                  if result.msg else "")
        result.data["failed_when_result"] = result.failed
    return result


def hidden(entry: dict[str, Any]) -> dict[str, Any]:
    """A journal/output entry of a ``no_log`` task: its message, data and diff replaced."""
    out = {k: v for k, v in entry.items() if k not in ("data", "diff")}
    out["msg"] = NO_LOG_MSG
    return out
