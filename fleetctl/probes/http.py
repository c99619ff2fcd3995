"""``probe http``: GET a path of the service from each host itself, and judge the answers.

The request runs in the host's agent (urllib), against ``service_host:service_port`` (host vars,
default 127.0.0.1:30000), so it sees what the host sees. Older SGLang names of the info
endpoints are tried when the new ones 404. Refused, timed out and non-JSON are answers; only a
host that cannot run the request fails. ``check_status`` is the pure check health gates reuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import InputError
from fleetctl.transport.base import HostResult, HostSession
from fleetctl.transport.fleet import Fleet

DEFAULT_PORT = 30000
DEFAULT_SERVICE_HOST = "127.0.0.1"
DEFAULT_TIMEOUT = 10.0
# New name -> older names tried in order when the new one answers 404 (shared/DOMAIN.md).
FALLBACKS: dict[str, tuple[str, ...]] = {
    "/server_info": ("/get_server_info",),
    "/model_info": ("/get_model_info",),
}
_MISSING = object()


@dataclass(frozen=True)
class HttpRequest:
    path: str
    port: int | None = None  # None: each host's service_port var, else 30000
    fields: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT
    max_text: int = 4000

    def __post_init__(self) -> None:
        if not self.path.startswith("/") or any(c.isspace() for c in self.path):
            raise InputError(f"{self.path!r}: PATH must start with / and hold no spaces (e.g. /server_info)")

    def fallbacks(self) -> tuple[str, ...]:
        base, sep, query = self.path.partition("?")
        return tuple(p + sep + query for p in FALLBACKS.get(base, ()))

    def params(self, session: HostSession) -> dict[str, Any]:
        return {
            "service_host": str(session.vars.get("service_host") or DEFAULT_SERVICE_HOST),
            "port": int(self.port or session.vars.get("service_port") or DEFAULT_PORT),
            "path": self.path, "fallbacks": list(self.fallbacks()), "timeout": self.timeout,
            "max_text": self.max_text,
        }


@dataclass(frozen=True)
class Attempt:
    path: str
    status: int | None
    error_kind: str | None


@dataclass(frozen=True)
class HttpAnswer:
    url: str
    asked: str
    path: str  # the path that answered (differs from ``asked`` after a fallback)
    status: int | None
    reason: str | None
    latency_ms: float | None
    content_type: str | None
    error_kind: str | None  # refused | timeout | dns | reset | error; None when HTTP answered
    error: str | None
    has_json: bool
    body: Any  # the parsed JSON body when has_json
    text: str | None  # the (truncated) body otherwise
    truncated: bool
    size: int | None
    json_error: str | None
    tried: tuple[Attempt, ...]
    fields: dict[str, Any] = field(default_factory=dict)  # --field path -> value (found ones only)
    missing_fields: tuple[str, ...] = ()

    @property
    def fell_back(self) -> bool:
        return self.path != self.asked

    @property
    def got(self) -> str:
        """What came back, in one word: the status code or the kind of failure."""
        return str(self.status) if self.status is not None else (self.error_kind or "no answer")

    @classmethod
    def from_remote(cls, doc: dict[str, Any], fields: tuple[str, ...] = ()) -> HttpAnswer:
        tried = tuple(Attempt(t["path"], t.get("status"), t.get("error_kind")) for t in doc.get("tried") or ())
        has_json = bool(doc.get("has_json"))
        body = doc.get("json") if has_json else None
        found: dict[str, Any] = {}
        missing: list[str] = []
        for path in fields:
            value = field_value(body, path) if has_json else _MISSING
            if value is _MISSING:
                missing.append(path)
            else:
                found[path] = value
        return cls(
            url=doc["url"], asked=doc.get("asked", doc["path"]), path=doc["path"], status=doc.get("status"),
            reason=doc.get("reason"), latency_ms=doc.get("latency_ms"), content_type=doc.get("content_type"),
            error_kind=doc.get("error_kind"), error=doc.get("error"), has_json=has_json, body=body,
            text=doc.get("text"), truncated=bool(doc.get("truncated")), size=doc.get("size"),
            json_error=doc.get("json_error"), tried=tried, fields=found, missing_fields=tuple(missing),
        )

    def to_dict(self, with_body: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "url": self.url, "asked": self.asked, "path": self.path, "fell_back": self.fell_back,
            "status": self.status, "reason": self.reason, "latency_ms": self.latency_ms,
            "content_type": self.content_type, "error_kind": self.error_kind, "error": self.error,
            "tried": [a.__dict__.copy() for a in self.tried],
        }
        if self.fields or self.missing_fields:
            out["fields"] = dict(self.fields)
            out["missing_fields"] = list(self.missing_fields)
        elif with_body:
            out["json" if self.has_json else "text"] = self.body if self.has_json else self.text
            out.update(truncated=self.truncated, size=self.size, json_error=self.json_error)
        return out


def field_value(doc: Any, path: str) -> Any:
    """``a.b.0.c``: dict keys and list indices (negative too); the sentinel ``_MISSING`` if absent."""
    current = doc
    for part in path.split("."):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and _is_index(part) and -len(current) <= int(part) < len(current):
            current = current[int(part)]
        else:
            return _MISSING
    return current


def _is_index(part: str) -> bool:
    return part.lstrip("-").isdigit()


def probe_http(session: HostSession, request: HttpRequest) -> HttpAnswer:
    # The agent's own urllib timeout bounds each attempt; allow the call a little more per attempt.
    attempts = 1 + len(request.fallbacks())
    doc = session.call("http_get", request.params(session), timeout=attempts * (2 * request.timeout) + 5)
    return HttpAnswer.from_remote(doc, request.fields)


def run_http(fleet: Fleet, request: HttpRequest) -> dict[str, HostResult[HttpAnswer]]:
    return fleet.map(lambda ctx: probe_http(ctx, request))


@dataclass(frozen=True)
class StatusReport:
    """``--expect-status``: hosts whose answer was not the expected HTTP status (refused counts)."""

    expected: int
    path: str
    failing: tuple[tuple[str, str], ...]  # (host, what it got)

    @property
    def ok(self) -> bool:
        return not self.failing

    def message(self) -> str:
        if self.ok:
            return f"expectation met: {self.path} answered {self.expected} on every host that answered"
        got = ", ".join(f"{host} ({what})" for host, what in self.failing)
        return f"expected {self.path} to answer {self.expected}, but not on: {got}"


def check_status(results: Mapping[str, HostResult[HttpAnswer]], expected: int, path: str) -> StatusReport:
    """Pure: which hosts that ran the request did not get ``expected``; failed hosts count under exit 2."""
    failing = tuple(
        (name, res.value.got) for name, res in sorted(results.items())
        if res.ok and res.value is not None and res.value.status != expected
    )
    return StatusReport(expected, path, failing)
