"""The SGLang Model Gateway's worker API (``smg`` 1.13.0, the renamed sglang-router), from the controller.

Confirmed on the installed smg 1.13.0: ``POST /workers {"url": ...}`` answers 202 with
``{"worker_id": <uuid>}`` and registers in the background (the worker's ``/health`` is checked);
``GET /workers`` lists ``{"id", "url", "is_healthy", "status", "load"}`` (status ``pending``,
``ready`` or ``draining``); ``DELETE /workers/{uuid}`` answers 202, marks the worker ``draining``
(no new requests), and removes it from the list a few seconds later; the requests already routed
keep streaming from it. ``/add_worker?url=`` is gone (404). A re-added URL gets a new id.

The controller talks to each gateway directly (gateways sit on the network the controller reaches,
as an operator's curl does); the worker's own ``/metrics`` are read on its host (``release/drain.py``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from fleetctl.errors import ExitCode, FleetError

TIMEOUT = 10.0


class GatewayError(FleetError):
    """A gateway did not answer, or answered something else than its worker API."""

    exit_code = ExitCode.HOST_FAILED


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    healthy: bool
    status: str  # pending | ready | draining (smg 1.13.0)
    load: int

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Worker:
        return cls(str(doc.get("id") or ""), str(doc.get("url") or "").rstrip("/"), bool(doc.get("is_healthy")),
                   str(doc.get("status") or ("ready" if doc.get("is_healthy") else "pending")),
                   int(doc.get("load") or 0))


class Gateway:
    """One gateway's worker API at ``url`` (``http://host:port``)."""

    def __init__(self, url: str, timeout: float = TIMEOUT) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def workers(self) -> list[Worker]:
        doc = self._call("GET", "/workers")
        rows = doc.get("workers") if isinstance(doc, dict) else None
        if not isinstance(rows, list):
            raise GatewayError(f"gateway {self.url}: GET /workers answered no worker list")
        return [Worker.from_doc(w) for w in rows if isinstance(w, dict)]

    def add(self, worker_url: str) -> str:
        """Register ``worker_url``; its new id (the gateway checks it in the background)."""
        doc = self._call("POST", "/workers", {"url": worker_url})
        return str(doc.get("worker_id") or "") if isinstance(doc, dict) else ""

    def remove(self, worker_id: str) -> None:
        self._call("DELETE", f"/workers/{worker_id}")

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data, method=method,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200].decode("utf-8", "replace").strip()
            raise GatewayError(f"gateway {self.url}: {method} {path} answered {exc.code} {detail}") from None
        except (OSError, ValueError) as exc:
            raise GatewayError(f"gateway {self.url} unreachable: {getattr(exc, 'reason', exc)}") from None
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise GatewayError(f"gateway {self.url}: {method} {path} answered no JSON") from None
