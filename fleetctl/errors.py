"""One error root, translated once at the CLI boundary into a line and an exit code."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What the process exit status means (the exit codes reference is generated from it)."""

    OK = 0
    BAD_ANSWER = 1  # the answer is "bad": drift found, an expectation failed
    HOST_FAILED = 2  # some hosts failed or were unreachable
    USAGE = 3  # usage or input error
    INTERNAL = 4  # a bug in fleetctl: traceback written to a log file


# What each exit status means to a person (the exit codes reference is generated from this).
EXIT_CODE_MEANINGS: tuple[tuple[int, str], ...] = (
    (ExitCode.OK, "every host ok"),
    (ExitCode.BAD_ANSWER, 'the answer is "bad": drift found, an expectation failed, a host\'s GPU health red, '
                          "a question answered no"),
    (ExitCode.HOST_FAILED, "some hosts failed or were unreachable (the others' results are still printed), "
                           "or a rollout halted"),
    (ExitCode.USAGE, "usage or input error: one line names the file and line, or the host"),
    (ExitCode.INTERNAL, "a bug in fleetctl: the traceback is written to `~/.cache/fleetctl/crash-*.log` "
                        "(`FLEETCTL_LOG_DIR`)"),
    (130, "interrupted (Ctrl-C): work in flight finished or rolled itself back, nothing new started"),
)


class FleetError(Exception):
    """Root of every error fleetctl expects and explains in one line."""

    exit_code: ExitCode = ExitCode.USAGE


class InputError(FleetError):
    """Bad input from a file or the command line; the message names the file and line."""


class InventoryError(InputError):
    """The inventory, its group_vars/host_vars, or a host pattern is wrong."""


class PatternError(InventoryError):
    """A host pattern matched nothing or is malformed."""


class LabError(FleetError):
    """The lab fleet could not be created, checked or stopped."""

    exit_code = ExitCode.HOST_FAILED


class HostError(FleetError):
    """Something went wrong on one host; carries the host name."""

    exit_code = ExitCode.HOST_FAILED

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host
        self.reason = message


class ConnectError(HostError):
    """The host could not be reached or authenticated (its result is 'unreachable')."""


class HostKeyError(ConnectError):
    """The host's key is unknown or changed: refused, never accepted silently."""


class CommandError(HostError):
    """A remote command exited non-zero or timed out (its result is 'failed')."""

    def __init__(self, host: str, command: str, exit_code: int | None, stderr_tail: str, why: str = "") -> None:
        what = ("timed out" + (f" {why}" if why else "")) if exit_code is None else f"exited {exit_code}"
        detail = f": {stderr_tail.strip()}" if stderr_tail.strip() else ""
        super().__init__(host, f"`{command}` {what}{detail}")
        self.command = command
        self.rc = exit_code
        self.stderr_tail = stderr_tail


class BecomeError(HostError):
    """sudo refused or could not be answered on the host (its result is 'failed')."""


class AgentError(HostError):
    """The remote agent died or broke its protocol."""


NOT_PERMITTED = "NotPermitted"  # the remote error type of remote/writable.py and the agent


class RemoteOperationError(HostError):
    """A remote operation raised on the host; the agent survives and says why."""

    def __init__(self, host: str, op: str, etype: str, message: str, traceback: str = "") -> None:
        # NotPermitted: the host refused a write this user may not make; its message is the line.
        super().__init__(host, message if etype == NOT_PERMITTED else f"{op}: {etype}: {message}")
        self.op = op
        self.etype = etype
        self.remote_message = message
        self.remote_traceback = traceback
