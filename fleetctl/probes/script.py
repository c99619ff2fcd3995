"""``probe script``: run the user's own stdlib-only script on every host and collect its output.

The script's source is read here and travels in the request; on the host the agent writes it to a
private temporary file, runs it with the venv's python (default) and removes it. The contract a
script relies on is written in examples/probes/README.md. A non-zero exit or a timeout fails
that host (its output is kept); stdout that is one JSON document comes back parsed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.adhoc import OutputBlock, gather
from fleetctl.errors import HostError, InputError
from fleetctl.probes import host_venv, probe_python
from fleetctl.transport.base import CommandResult, HostResult, HostSession, Status
from fleetctl.transport.fleet import Fleet
from fleetctl.transport.output import printable, tail_text

DEFAULT_TIMEOUT = 120.0
MAX_SOURCE = 1024 * 1024


def parse_args(items: Sequence[str]) -> dict[str, str]:
    """``--arg key=value`` items; values stay strings (the script decides what they mean)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or any(c.isspace() for c in key.strip()):
            raise InputError(f"--arg {item!r}: expected KEY=VALUE (e.g. --arg device=NVIDIA_H200)")
        out[key.strip()] = value
    return out


@dataclass(frozen=True)
class ScriptRequest:
    path: str  # as given on the command line: names the script in messages and tracebacks
    source: str
    args: dict[str, str]
    venv: str | None = None
    python: str | None = None  # overrides the venv's interpreter
    timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def load(cls, path: str, args: Sequence[str] = (), venv: str | None = None, python: str | None = None,
             timeout: float = DEFAULT_TIMEOUT) -> ScriptRequest:
        """Read and syntax-check the script here, so a typo is one line naming file:line, not N failures."""
        file = Path(path)
        try:
            raw = file.read_bytes()
        except OSError as exc:
            raise InputError(f"{path}: cannot read the script: {exc.strerror or exc}") from None
        if len(raw) > MAX_SOURCE:
            raise InputError(f"{path}: {len(raw)} bytes; a probe script is at most {MAX_SOURCE}")
        try:
            source = raw.decode("utf-8")
            compile(source, path, "exec")
        except UnicodeDecodeError as exc:
            raise InputError(f"{path}: not UTF-8 text ({exc.reason})") from None
        except SyntaxError as exc:
            raise InputError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None
        return cls(path, source, parse_args(args), venv, python, timeout)

    def params(self, python: str | None) -> dict[str, Any]:
        return {"source": self.source, "name": Path(self.path).name, "python": python, "args": self.args,
                "timeout": self.timeout}


@dataclass(frozen=True)
class ScriptResult:
    python: str
    rc: int | None
    timed_out: bool
    duration_s: float | None
    stdout: str
    stderr: str
    script_path: str | None  # the temporary file it ran as on the host (gone now)
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def json_value(self) -> tuple[bool, Any]:
        """(True, document) when stdout is exactly one JSON document."""
        text = self.stdout.strip()
        if not text or self.stdout_truncated:
            return False, None
        try:
            return True, json.loads(text)
        except ValueError:
            return False, None

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        is_json, doc = self.json_value
        out: dict[str, Any] = {"rc": self.rc, "timed_out": self.timed_out, "duration_s": self.duration_s,
                               "python": self.python}
        out.update({"json": doc} if is_json else {"text": self.stdout})
        out.update(stderr=self.stderr, stdout_truncated=self.stdout_truncated,
                   stderr_truncated=self.stderr_truncated, script_path=self.script_path)
        return out

    def shown_output(self, local_path: str) -> tuple[str, str]:
        """stdout/stderr for people: JSON pretty-printed, the host's temporary path shown as the
        local file, so identical results of many hosts gather into one block."""
        is_json, doc = self.json_value
        out = json.dumps(doc, indent=2, sort_keys=True) if is_json else self.stdout
        err = self.stderr.replace(self.script_path, local_path) if self.script_path else self.stderr
        return out, err


def script_python(session: HostSession, request: ScriptRequest) -> str | None:
    """--python, else the venv's python, else None: the agent's own interpreter."""
    return request.python or probe_python(session, request.venv)


def probe_script(session: HostSession, request: ScriptRequest) -> ScriptResult:
    python = script_python(session, request)
    # The agent enforces the script's timeout itself; the call gets slack to report the kill.
    doc = session.call("userscript", request.params(python), timeout=request.timeout + 15)
    if doc.get("error"):
        venv = None if request.python else host_venv(session, request.venv)
        raise HostError(session.name, (f"venv {venv} not found: " if venv else "") + str(doc["error"]))
    return ScriptResult(
        python=doc["python"], rc=doc.get("rc"), timed_out=bool(doc.get("timed_out")),
        duration_s=doc.get("duration_s"), stdout=printable(doc.get("stdout") or ""),
        stderr=printable(doc.get("stderr") or ""),
        script_path=doc.get("script_path"), stdout_truncated=bool(doc.get("stdout_truncated")),
        stderr_truncated=bool(doc.get("stderr_truncated")),
    )


def run_script(fleet: Fleet, request: ScriptRequest) -> dict[str, HostResult[ScriptResult]]:
    """Run everywhere; a script that exits non-zero or times out marks its host failed."""
    results = fleet.map(lambda ctx: probe_script(ctx, request))
    for res in results.values():
        if res.ok and res.value is not None and not res.value.ok:
            res.status = Status.FAILED
            res.reason = failure_reason(res.value, request.timeout)
    return results


def failure_reason(result: ScriptResult, timeout: float) -> str:
    if result.timed_out:
        return f"timed out after {timeout:g}s (killed)"
    last = tail_text(result.stderr, 1)
    return f"exited {result.rc}" + (f": {last}" if last else "")


def gather_outputs(results: dict[str, HostResult[ScriptResult]], local_path: str) -> list[OutputBlock]:
    """Hosts with identical output gathered as ``fleetctl shell`` does (clush -b)."""
    as_commands: dict[str, HostResult[CommandResult]] = {}
    for name, res in results.items():
        command = None
        if res.value is not None:
            out, err = res.value.shown_output(local_path)
            if res.value.timed_out:
                err = (err.rstrip("\n") + "\n" if err.strip() else "") + res.reason
            command = CommandResult(local_path, res.value.rc if res.value.rc is not None else -1, out, err)
        as_commands[name] = HostResult(name, res.status, value=command, reason=res.reason)
    return gather(as_commands)
