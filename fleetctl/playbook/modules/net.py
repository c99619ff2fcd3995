"""``uri`` (an HTTP request to an API: a load balancer, a router, a chat hook) and ``wait_for`` (a
port or a path in a state). Both run on the task's host, or where ``delegate_to`` sends them:
``delegate_to: localhost`` asks from the controller. Check mode sends nothing but GET/HEAD."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, model_validator

from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module


class UriArgs(Args):
    url: str
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"] = "GET"
    body: Any = None  # text as it is; a mapping or list is sent as JSON (body_format json)
    body_format: Literal["raw", "json"] = "raw"
    headers: dict[str, str] = Field(default_factory=dict)
    status_code: list[int] = Field(default_factory=lambda: [200])
    timeout: float = Field(default=30.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _one_status(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("status_code"), int | str):
            data = {**data, "status_code": [data["status_code"]]}
        return data


@module("uri", UriArgs, free_form="url")
def uri(mc: ModuleContext, args: UriArgs) -> TaskResult:
    """Send one HTTP request; fails unless the status is one of ``status_code`` (default 200).
    Registers ``status``, ``json`` (a JSON answer) and ``content``."""
    changes = args.method not in ("GET", "HEAD")
    if mc.check and changes:
        return TaskResult(skipped=True, msg=f"check mode: {args.method} {args.url} not sent")
    body, headers = args.body, dict(args.headers)
    if body is not None and (args.body_format == "json" or not isinstance(body, str)):
        body = json.dumps(body)
        headers.setdefault("Content-Type", "application/json")
    answer = mc.session.call("http_request", {"url": args.url, "method": args.method, "body": body,
                                              "headers": headers, "timeout": args.timeout},
                             timeout=args.timeout + 10)
    data = {"status": answer.get("status"), "json": answer.get("json"), "content": answer.get("text"),
            "url": args.url, "elapsed_ms": answer.get("elapsed_ms")}
    if answer.get("status") is None:
        return TaskResult(failed=True, msg=f"{args.method} {args.url}: {answer.get('error')}", data=data)
    if answer["status"] not in args.status_code:
        wanted = ", ".join(str(s) for s in args.status_code)
        text = (answer.get("text") or json.dumps(answer.get("json")) or "")[:200]
        return TaskResult(failed=True, data=data, msg=f"{args.method} {args.url}: status {answer['status']} "
                                                      f"(expected {wanted}){': ' + text if text else ''}")
    return TaskResult(changed=changes, data=data, msg=f"{args.method} {args.url}: {answer['status']}")


class WaitForArgs(Args):
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535)
    path: str | None = None
    state: Literal["started", "stopped", "present", "absent"] | None = None
    timeout: float = Field(default=300.0, ge=0)
    delay: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _one_target(self) -> WaitForArgs:
        if (self.port is None) == (self.path is None):
            raise ValueError("wait_for: give `port` or `path` (one of them)")
        allowed = ("started", "stopped") if self.port is not None else ("present", "absent")
        if self.state is None:
            self.state = allowed[0]  # type: ignore[assignment]
        elif self.state not in allowed:
            raise ValueError(f"wait_for: state {self.state} is for a {'path' if self.port else 'port'}; "
                             f"use {' or '.join(allowed)}")
        return self


@module("wait_for", WaitForArgs)
def wait_for(mc: ModuleContext, args: WaitForArgs) -> TaskResult:
    """Wait until ``port`` on ``host`` is started/stopped, or ``path`` is present/absent, within ``timeout``."""
    what = f"{args.host}:{args.port}" if args.port is not None else str(args.path)
    if mc.check:
        return TaskResult(skipped=True, msg=f"check mode: not waiting for {what}")
    answer = mc.session.call("wait_for", {"host": args.host, "port": args.port, "path": args.path,
                                          "state": args.state, "timeout": args.timeout, "delay": args.delay},
                             timeout=args.timeout + args.delay + 15)
    data = {"elapsed": answer["elapsed"], "state": answer["state"]}
    if not answer["ok"]:
        return TaskResult(failed=True, data=data, msg=f"{what} still {answer['state']} after {args.timeout:g}s "
                                                      f"(waited for {args.state})")
    return TaskResult(data=data, msg=f"{what} {args.state} after {answer['elapsed']:g}s")
