"""Playbook module ``probe``: ask this host's installed software one question, as ``fleetctl probe``
does (``grep``, ``symbol``, ``import``, ``http`` or ``script``), and optionally fail when the answer
is not the expected one.

``data`` is the probe's JSON answer (plus ``present`` where the question has one), so ``register``
and ``when`` can use it. Read-only, so it runs the same in check mode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fleetctl.errors import InputError
from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, key_error, module
from fleetctl.probes import Expect
from fleetctl.probes import http as http_core
from fleetctl.probes import imports as import_core
from fleetctl.probes import script as script_core
from fleetctl.probes.search import GrepRequest, expectation, grep_host
from fleetctl.probes.symbols import SymbolRequest, is_found, symbol_host

KINDS = ("grep", "symbol", "import_", "http", "script")
# The options each kind takes, as the matching CLI command offers them.
OPTIONS: dict[str, frozenset[str]] = {
    "grep": frozenset({"venv", "package", "subpath", "ignore_case", "regex", "max_hits", "context", "cache",
                       "expect"}),
    "symbol": frozenset({"venv", "package", "subpath", "expect"}),
    "import_": frozenset({"venv", "timeout", "expect"}),
    "http": frozenset({"port", "fields", "status", "timeout"}),
    "script": frozenset({"venv", "python", "timeout", "args"}),
}


def _key(name: str) -> str:
    return "import" if name == "import_" else name


class ProbeArgs(Args):
    grep: list[str] | None = None  # terms: a host passes `expect: present` when every term matches
    symbol: str | None = None  # NAME or Class.member: present where it is DEFINED
    import_: str | None = Field(default=None, alias="import")  # MODULE[:ATTR]
    http: str | None = None  # a path of the service, GET from the host itself
    script: str | None = None  # a stdlib-only script on the controller, relative to the playbook
    venv: str | None = None  # default: the host's venv var
    package: str = "sglang"
    subpath: str | None = None
    ignore_case: bool = False
    regex: bool = False
    max_hits: int = Field(default=200, ge=0)
    context: int = Field(default=0, ge=0, le=50)
    cache: bool = True  # grep: false reads every file, as the CLI's --no-cache
    port: int | None = Field(default=None, ge=1, le=65535)
    fields: list[str] = []
    status: int | None = Field(default=None, ge=100, le=599)  # http: fail unless it answers this status
    timeout: float | None = Field(default=None, ge=0.1)
    args: dict[str, str] = {}
    python: str | None = None
    expect: Literal["present", "absent"] | None = None

    @field_validator("grep", mode="before")
    @classmethod
    def _terms(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("args", mode="before")
    @classmethod
    def _arg_strings(cls, value: Any) -> Any:
        # The script reads strings (FLEETCTL_ARGS); YAML numbers and booleans arrive as their JSON text.
        if isinstance(value, dict):
            return {k: v if isinstance(v, str) else json.dumps(v) if isinstance(v, int | float | bool) else v
                    for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _one_question(self) -> ProbeArgs:
        asked = [k for k in KINDS if getattr(self, k) is not None]
        if len(asked) != 1:
            raise ValueError("probe needs exactly one of grep, symbol, import, http, script"
                             + (f" (got {', '.join(_key(k) for k in asked)})" if asked else ""))
        kind = asked[0]
        for name in sorted(self.model_fields_set - set(KINDS) - OPTIONS[kind]):
            hint = " (use status)" if name == "expect" and kind == "http" else ""
            raise key_error("probe", _key(name), f"not an option of probe {_key(kind)}{hint}", getattr(self, name))
        try:  # the same checks the CLI makes before connecting
            if kind == "grep":
                GrepRequest(tuple(self.grep or ()), self.package, self.subpath, regex=self.regex).validate()
            elif kind == "symbol":
                SymbolRequest(self.symbol or "", self.package, self.subpath).validate()
            elif kind == "import_":
                import_core.ImportRequest.parse(self.import_ or "")
            elif kind == "http":
                http_core.HttpRequest(self.http or "")
            else:
                script_core.parse_args([f"{k}={v}" for k, v in self.args.items()])
        except InputError as exc:
            raise key_error("probe", _key(kind), str(exc), getattr(self, kind)) from None
        return self

    @property
    def kind(self) -> str:
        return _key(next(k for k in KINDS if getattr(self, k) is not None))


@dataclass
class Answer:
    data: dict[str, Any]
    msg: str
    present: bool | None = None  # grep / symbol / import: what `expect: present` is checked against
    what: str = ""  # names the expectation in the failure message
    failure: str = ""  # http status or script exit: the host fails with this line
    absent: bool | None = None  # what `expect: absent` checks; None: not present

    def holds(self, want: Expect) -> bool | None:
        if self.present is None:
            return None
        if want is Expect.PRESENT:
            return self.present
        return (not self.present) if self.absent is None else self.absent


def ask_grep(mc: ModuleContext, a: ProbeArgs) -> Answer:
    req = GrepRequest(tuple(a.grep or ()), a.package, a.subpath, a.ignore_case, a.regex, a.max_hits, a.context,
                      a.venv, a.cache)
    res = grep_host(mc.session, req)
    counts = ", ".join(f"{t}: {n}" for t, n in res.counts.items())
    # As the CLI: present means every term matches, absent that no term does.
    present, absent = expectation(Expect.PRESENT)(res), not expectation(Expect.ABSENT)(res)
    what = "all terms" if a.expect == Expect.ABSENT.value else "every term"
    return Answer({**res.to_dict(), "present": present, "absent": absent}, f"matching lines {counts}", present, what,
                  absent=absent)


def ask_symbol(mc: ModuleContext, a: ProbeArgs) -> Answer:
    res = symbol_host(mc.session, SymbolRequest(a.symbol or "", a.package, a.subpath, a.venv))
    msg = f"{a.symbol}: {len(res.definitions)} definitions, {len(res.references)} references in {res.package_dir}"
    return Answer({**res.to_dict(), "present": is_found(res)}, msg, is_found(res), f"a definition of {a.symbol}")


def ask_import(mc: ModuleContext, a: ProbeArgs) -> Answer:
    req = import_core.ImportRequest.parse(a.import_ or "", a.venv, a.timeout or import_core.DEFAULT_TIMEOUT)
    res = import_core.probe_import(mc.session, req)
    if res.imported:
        owner = f" ({res.dist.name} {res.dist.version})" if res.dist else ""
        msg = f"imported {res.module}{owner}" + (f", {res.attr} {'present' if res.attr_found else 'absent'}"
                                                 if res.attr else "")
    else:
        msg = f"NOT imported {res.module}: {res.error_type}: {res.error}"
    return Answer(res.to_dict(), msg, res.present, req.target)


def ask_http(mc: ModuleContext, a: ProbeArgs) -> Answer:
    req = http_core.HttpRequest(a.http or "", a.port, tuple(a.fields), a.timeout or http_core.DEFAULT_TIMEOUT)
    res = http_core.probe_http(mc.session, req)
    msg = f"GET {res.path}: {res.got}" + (f" in {res.latency_ms:.1f} ms" if res.latency_ms is not None else "")
    failure = f"expected {a.http} to answer {a.status}, got {res.got}" if a.status and res.status != a.status else ""
    return Answer(res.to_dict(), msg, failure=failure)


def ask_script(mc: ModuleContext, a: ProbeArgs) -> Answer:
    path = str(mc.path(a.script or ""))
    timeout = a.timeout or script_core.DEFAULT_TIMEOUT
    req = script_core.ScriptRequest.load(path, [f"{k}={v}" for k, v in a.args.items()], a.venv, a.python, timeout)
    res = script_core.probe_script(mc.session, req)
    failure = "" if res.ok else f"{a.script}: {script_core.failure_reason(res, timeout)}"
    return Answer(res.to_dict(), f"{a.script}: exited {res.rc}", failure=failure)


ASK = {"grep": ask_grep, "symbol": ask_symbol, "import": ask_import, "http": ask_http, "script": ask_script}


@module("probe", ProbeArgs)
def probe(mc: ModuleContext, args: ProbeArgs) -> TaskResult:
    """Ask one probe question of this host (data: the answer); ``expect: present|absent`` fails the
    host where the answer is not that; ``status`` does for ``http``."""
    answer = ASK[args.kind](mc, args)
    if answer.failure:
        return TaskResult(failed=True, msg=answer.failure, data=answer.data)
    if args.expect is not None:
        want = Expect(args.expect)
        if answer.holds(want) is False:
            return TaskResult(failed=True, data=answer.data,
                              msg=f"expected {answer.what} {want.value} on {mc.host}, it is not: {answer.msg}")
    return TaskResult(msg=answer.msg, data=answer.data)
