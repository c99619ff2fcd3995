"""Ansible's ``async``/``poll`` task keywords and its ``async_status`` module, for ``shell``,
``command`` and ``get_url``: a long command runs detached on the host (``remote/async_job.py``), so no SSH channel
stays open for its whole length; the controller reads the job's file over short calls.

``async: N`` is the job's time limit in seconds: past it the job's process group is killed and the
task fails with Ansible's message. ``poll: P`` (default 15) > 0 checks the job every P seconds and
the task's result is the command's, as if run directly. ``poll: 0`` starts the job and moves on: the
result has ``ansible_job_id``, and ``async_status: {jid: ...}`` (with ``until: r.finished``) reads it
later, from any connection; ``mode: cleanup`` removes its file. In check mode no job starts: the
module runs as in check mode itself (``shell``/``command`` are skipped, as Ansible).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from typing import Any, Literal, cast

from fleetctl import hostpaths
from fleetctl.playbook.modules.base import Args, Module, ModuleContext, TaskResult, module
from fleetctl.playbook.modules.command import CommandArgs, ShellArgs, as_shell, shell_line, shell_result
from fleetctl.playbook.modules.files import remote_call
from fleetctl.playbook.modules.hostget import GetUrlArgs, get_url_params, get_url_result
from fleetctl.transport.agent import _inline_code

ASYNC_MODULES = frozenset({"shell", "command", "get_url"})
# get_url as a job: remote/get_url.py's main, its parameters read from stdin, its answer printed.
_GET_URL_CALL = ("\nimport json,sys\ntry:\n    print(json.dumps(main(json.loads(sys.stdin.read()))))\n"
                 "except GetUrlError as exc:\n    sys.exit(str(exc))\n")  # its refusal: one line on stderr
TIMED_OUT = "async task did not complete within the requested time - {}s"


def load_problem(module_name: str, options: Any) -> tuple[str, str] | None:
    """(key, message) when a task's ``async``/``poll`` cannot work; None when they can (or are absent)."""
    if options.async_ is None:
        return ("poll", "poll: needs `async` (the job's time limit in seconds)") if options.poll is not None else None
    if module_name not in ASYNC_MODULES:
        return "async", f"async: runs {', '.join(sorted(ASYNC_MODULES))} tasks as host jobs, not {module_name}"
    return None


def _folder(mc: ModuleContext) -> str:
    return f"{hostpaths.state_dir(mc.vars)}/async"


def _call(mc: ModuleContext, action: str, jid: str, **more: Any) -> Any:
    return remote_call(mc, "async_job", "AsyncJobError", {"action": action, "jid": jid, "dir": _folder(mc), **more})


def run_async(mc: ModuleContext, mod: Module, args: Args, limit: int, poll: int | None) -> TaskResult:
    """The task as a detached host job: waited for (``poll`` > 0) or left running (``poll: 0``)."""
    if mc.check:
        return mod.fn(mc, args)
    job = _job(mc, args)
    if isinstance(job, TaskResult):  # creates / removes
        return job
    jid = f"j{secrets.randbelow(10 ** 12)}.{os.getpid()}"
    started = _call(mc, "start", jid, **job, timeout=limit, code=_inline_code("async_job", "fleetctl_async_job"))
    if poll == 0:
        return TaskResult(changed=True, msg=f"started job {jid}", data=_job_keys(started))
    return _wait(mc, jid, limit, 15 if poll is None else poll)


def _job(mc: ModuleContext, args: Args) -> dict[str, Any] | TaskResult:
    """What the host job runs: a shell line, or get_url's host code with its parameters."""
    if isinstance(args, GetUrlArgs):
        code = _inline_code("get_url", "fleetctl_get_url") + _GET_URL_CALL
        return {"kind": "python", "command": code, "input": json.dumps(get_url_params(mc, args))}
    line = shell_line(mc, as_shell(args) if isinstance(args, CommandArgs) else cast(ShellArgs, args))
    return line if isinstance(line, TaskResult) else {"kind": "shell", "command": line}


def _wait(mc: ModuleContext, jid: str, limit: int, poll: int) -> TaskResult:
    """Poll the job until it ends, or kill it once its time limit has passed here too. Ctrl-C does not
    wait for the job: the task fails at once and the job runs on to its own limit."""
    deadline = time.monotonic() + limit
    while True:
        record = _call(mc, "status", jid)
        if not record.get("finished") and time.monotonic() >= deadline:
            record = _call(mc, "kill", jid, msg=TIMED_OUT.format(limit))
        if record.get("finished"):
            _call(mc, "cleanup", jid)  # as Ansible: a job it waited for leaves no file behind
            return job_result(record)
        if not mc.run.operator.wait(max(0.0, min(poll, deadline - time.monotonic())) or 0.2):
            return TaskResult(failed=True, msg=f"the run stopped while job {jid} runs on (its limit: {limit}s); "
                                               f"async_status jid={jid} reads it", data=_job_keys(record))


def _job_keys(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record.get(k) for k in ("ansible_job_id", "started", "finished", "results_file")}


def job_result(record: dict[str, Any]) -> TaskResult:
    """A finished job as the task's result: the command's (rc, stdout, stderr...) or why it ended."""
    if record.get("rc") is None:
        return TaskResult(changed=True, failed=True, msg=record.get("msg") or "job ended without an exit status",
                          data={**_job_keys(record), "rc": None, "stdout": record.get("stdout", ""),
                                "stderr": record.get("stderr", "")})
    if record.get("kind") == "python":
        return _python_result(record)
    res = shell_result(record["rc"], record.get("stdout", ""), record.get("stderr", ""), record.get("delta", 0.0))
    res.data.update(_job_keys(record))
    return res


def _python_result(record: dict[str, Any]) -> TaskResult:
    """get_url's job: its answer (the last line it printed), or its refusal (the last line of its error)."""
    if record["rc"] != 0:
        why = (record.get("stderr") or "").strip().splitlines()[-1:] or [f"exit {record['rc']}"]
        return TaskResult(failed=True, msg=why[0][:300], data=_job_keys(record))
    res = get_url_result(json.loads(record["stdout"].strip().splitlines()[-1]))
    res.data.update(_job_keys(record))
    return res


class AsyncStatusArgs(Args):
    jid: str
    mode: Literal["status", "cleanup"] = "status"


@module("async_status", AsyncStatusArgs)
def async_status(mc: ModuleContext, args: AsyncStatusArgs) -> TaskResult:
    """A job started with ``async`` and ``poll: 0``: ``finished`` (0/1) and, once finished, its result
    (``rc``, ``stdout``, ``stderr``; failed as the command failed). ``mode: cleanup`` removes its file.
    Read-only, so it runs in check mode too."""
    if args.mode == "cleanup":
        gone = _call(mc, "cleanup", args.jid)
        return TaskResult(msg=f"job {args.jid} cleaned up", data=gone)
    record = _call(mc, "status", args.jid)
    if not record.get("finished"):
        return TaskResult(msg=f"job {args.jid} running", data=_job_keys(record))
    return job_result(record)

