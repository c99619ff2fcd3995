"""``shell`` (a command line on the host), ``command`` (argv, no shell), ``assert`` (conditions on
variables) and ``fail``."""

from __future__ import annotations

import re
import shlex
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from fleetctl.errors import InputError
from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module
from fleetctl.templating import truthy

OUTPUT_KEEP = 64 * 1024  # what a registered result keeps of stdout/stderr (the tail)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def with_environment(env: dict[str, str], command: str) -> str:
    """``command`` run with these environment variables exported (names checked, values quoted)."""
    for name in env:
        if not _ENV_NAME.match(name):
            raise InputError(f"environment: {name!r} is not a variable name")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"export {exports}; {command}"


class ShellArgs(Args):
    cmd: str
    chdir: str | None = None
    creates: str | None = None  # skip when this path exists on the host (idempotence, as Ansible)
    removes: str | None = None  # skip when this path does not exist
    timeout: float | None = Field(default=None, gt=0)


@module("shell", ShellArgs, free_form="cmd")
def shell(mc: ModuleContext, args: ShellArgs) -> TaskResult:
    """Run a command line with the host's shell. Check mode runs nothing (skipped), as Ansible."""
    line = shell_line(mc, args)
    if isinstance(line, TaskResult):
        return line
    res = mc.session.run(line, timeout=args.timeout)
    return shell_result(res.rc, res.stdout, res.stderr, res.duration_s)


def shell_line(mc: ModuleContext, args: ShellArgs) -> str | TaskResult:
    """The command line the task runs (chdir, environment), or why it is skipped (creates, removes,
    check mode); ``async`` runs the same line detached."""
    if args.creates:
        probe = mc.session.run(f"test -e {shlex.quote(args.creates)}", timeout=30)
        if probe.rc == 0:
            return TaskResult(skipped=True, msg=f"{args.creates} exists")
    if args.removes:
        probe = mc.session.run(f"test -e {shlex.quote(args.removes)}", timeout=30)
        if probe.rc != 0:
            return TaskResult(skipped=True, msg=f"{args.removes} does not exist")
    if mc.check:
        return TaskResult(skipped=True, msg="check mode: shell commands are not run")
    command = f"cd {shlex.quote(args.chdir)} && {args.cmd}" if args.chdir else args.cmd
    if mc.environment:  # the task's `environment`, each name checked and each value quoted
        command = with_environment(mc.environment, command)
    return command


def shell_result(rc: int, stdout: str, stderr: str, duration_s: float) -> TaskResult:
    """A command's exit status and output as the task's result (``rc``, ``stdout``, ``stderr``...)."""
    out, err = stdout[-OUTPUT_KEEP:], stderr[-OUTPUT_KEEP:]
    data = {"rc": rc, "stdout": out.rstrip("\n"), "stderr": err.rstrip("\n"),  # Ansible strips the last newline
            "duration_s": round(duration_s, 3), "stdout_lines": out.splitlines(), "stderr_lines": err.splitlines()}
    if rc != 0:
        tail = (stderr.strip() or stdout.strip()).splitlines()[-1:] or [""]
        return TaskResult(changed=True, failed=True, msg=f"exit {rc}: {tail[0][:300]}", data=data)
    return TaskResult(changed=True, msg=stdout.strip().splitlines()[-1][:200] if stdout.strip() else "",
                      data=data)


class CommandArgs(Args):
    argv: list[str] = Field(min_length=1)
    chdir: str | None = None
    creates: str | None = None
    removes: str | None = None
    timeout: float | None = Field(default=None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _cmd(cls, value: Any) -> Any:
        """Ansible's ``cmd: "prog args"`` is the free form's other spelling."""
        if isinstance(value, dict) and "cmd" in value and "argv" not in value:
            value = {**value, "argv": value["cmd"]}
            value.pop("cmd")
        return value

    @field_validator("argv", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return shlex.split(value) if isinstance(value, str) else value


@module("command", CommandArgs, free_form="argv")
def command(mc: ModuleContext, args: CommandArgs) -> TaskResult:
    """Run a program with its arguments, no shell in between (each word quoted); else as ``shell``."""
    return shell(mc, as_shell(args))


def as_shell(args: CommandArgs) -> ShellArgs:
    return ShellArgs(cmd=shlex.join(args.argv), chdir=args.chdir, creates=args.creates, removes=args.removes,
                     timeout=args.timeout)


class AssertArgs(Args):
    expressions: ClassVar[tuple[str, ...]] = ("that",)  # checked as Jinja2 expressions when the playbook loads

    that: list[str | bool]
    fail_msg: str | None = None
    success_msg: str | None = None
    msg: str | None = None  # an alias of fail_msg, as Ansible

    @field_validator("that", mode="before")
    @classmethod
    def _one(cls, value: object) -> object:
        return [value] if isinstance(value, str | bool) else value


@module("assert", AssertArgs, free_form="that")
def assert_(mc: ModuleContext, args: AssertArgs) -> TaskResult:
    """Every condition must hold on the host; the first that does not fails it, with the message."""
    for cond in args.that:
        value = mc.run.evaluate(cond, mc.vars) if isinstance(cond, str) else cond
        if not truthy(value):
            why = args.fail_msg or args.msg
            return TaskResult(failed=True, msg=f"{why} (failed: {cond})" if why else f"assertion failed: {cond}",
                              data={"assertion": cond})
    return TaskResult(msg=args.success_msg or "all assertions passed")


class FailArgs(Args):
    msg: str = "failed as requested"


@module("fail", FailArgs, free_form="msg")
def fail(mc: ModuleContext, args: FailArgs) -> TaskResult:
    """Fail the host with a message (use with ``when``)."""
    return TaskResult(failed=True, msg=args.msg)

