"""Probes: questions asked of every host's installed software, answered side by side.

Each probe module (search, symbols, imports, http, script) turns a request dataclass into one
remote call per host and the host's JSON answer into result dataclasses. Shared here: which
interpreter answers (the venv's), and ``--expect present|absent`` (the deploy health gates
reuse it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from fleetctl.transport.base import HostResult, HostSession

T = TypeVar("T")


def host_venv(session: HostSession, venv: str | None) -> str | None:
    """The venv a probe looks into: ``--venv``, else the host's ``venv`` var, else none."""
    chosen = venv or session.vars.get("venv")
    return str(chosen).rstrip("/") if chosen else None


def probe_python(session: HostSession, venv: str | None) -> str | None:
    """The interpreter that runs a probe: the venv's python, or None for the agent's own."""
    chosen = host_venv(session, venv)
    return f"{chosen}/bin/python" if chosen else None


class Expect(StrEnum):
    PRESENT = "present"
    ABSENT = "absent"


@dataclass(frozen=True)
class ExpectationReport:
    expect: Expect
    failing: tuple[str, ...]  # hosts where the expectation does not hold (ok hosts only)

    @property
    def ok(self) -> bool:
        return not self.failing

    def message(self, what: str) -> str:
        if self.ok:
            return f"expectation met: {what} {self.expect.value} on every host that answered"
        return f"expected {what} {self.expect.value}, but not on: {', '.join(self.failing)}"


def check_expectation(
    results: Mapping[str, HostResult[T]], found: Callable[[T], bool], expect: Expect,
) -> ExpectationReport:
    """Which answering hosts break ``expect``; failed/unreachable hosts count under exit 2 instead."""
    want = expect is Expect.PRESENT
    failing = tuple(sorted(
        name for name, res in results.items() if res.ok and res.value is not None and found(res.value) != want
    ))
    return ExpectationReport(expect, failing)


def as_dict(value: Any) -> Any:
    """JSON form of a probe result dataclass (``to_dict`` when it has one)."""
    return value.to_dict() if hasattr(value, "to_dict") else value
