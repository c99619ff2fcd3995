"""``service`` (the release's service: started, stopped, restarted, status), ``wait_http`` and
``facts`` (sets the host variable ``facts``)."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module


class ServiceArgs(Args):
    state: Literal["started", "stopped", "restarted", "status"] = "status"


@module("service", ServiceArgs, free_form="state")
def service(mc: ModuleContext, args: ServiceArgs) -> TaskResult:
    """The inference servers of the current release (systemd units or fleetctl's supervisor), every
    instance of a release that has several, in order."""
    from fleetctl.release.servers import current_names
    from fleetctl.release.service import control, layout_for

    layout = layout_for(mc.session.vars)
    names = current_names(mc.session, layout) or [None]
    running = {n: bool(mc.session.call("service_host", control(layout, "status", n)).get("running")) for n in names}
    data: dict[str, Any] = {"running": all(running.values()), "manager": None}
    wanted = {n: {"started": None if running[n] else "start", "stopped": "stop" if running[n] else None,
                  "restarted": "restart", "status": None}[args.state] for n in names}
    todo = [(n, op_) for n, op_ in wanted.items() if op_ is not None]
    if not todo:
        return TaskResult(msg="running" if data["running"] else "stopped", data=data)
    op = todo[0][1]
    from fleetctl.release import gateway_steps as gateway

    if mc.check:  # with router_url: the gateway steps too
        steps = gateway.service_plan(mc.session, layout, [n for n, _ in todo], op)
        return TaskResult(changed=True, msg="; ".join([f"would {op}", *(f"{g.name}: {g.detail}" for g in steps)]),
                          data=data)
    steps = []
    for name, each in todo:  # each server out of the gateways, changed, back in (router_url)
        def change(one: gateway.OneServer, name: str | None = name, each: str = each) -> None:
            answer = mc.session.call("service_host", control(layout, each, name))
            running[name] = bool(answer.get("running"))
            data["manager"] = answer.get("manager")

        steps += gateway.service_op(mc.session, layout, name, each, change)
    data["running"] = all(running.values())
    data["gateway"] = [g.to_dict() for g in steps]
    return TaskResult(changed=True, msg=f"{op}ed" if op != "stop" else "stopped", data=data)


class WaitHttpArgs(Args):
    path: str = "/health"
    port: int | None = None  # default: the host's service_port, else 30000
    status: int = 200
    timeout: float = Field(default=60.0, gt=0)
    interval: float = Field(default=1.0, gt=0)


@module("wait_http", WaitHttpArgs, free_form="path")
def wait_http(mc: ModuleContext, args: WaitHttpArgs) -> TaskResult:
    """GET ``path`` on the host's service from the host itself until it answers ``status``."""
    from fleetctl.probes.http import HttpRequest, probe_http

    start = time.monotonic()
    last = "no answer"
    while True:
        answer = probe_http(mc.session, HttpRequest(args.path, port=args.port, timeout=min(10.0, args.timeout)))
        waited = round(time.monotonic() - start, 2)
        if answer.status == args.status:
            return TaskResult(msg=f"{args.path}: {answer.status} after {waited:g}s",
                              data={"status": answer.status, "waited_s": waited, "json": answer.body})
        last = answer.got
        if time.monotonic() - start + args.interval > args.timeout:
            return TaskResult(failed=True, msg=f"{args.path}: no {args.status} within {args.timeout:g}s "
                                               f"(last: {last})", data={"status": answer.status, "waited_s": waited})
        time.sleep(args.interval)


class FactsArgs(Args):
    venv: str | None = None  # default: the host's `venv` var


@module("facts", FactsArgs)
def facts(mc: ModuleContext, args: FactsArgs) -> TaskResult:
    """Gather the host's facts (OS, CPUs, memory, disks, GPUs, the venv's ML stack) into ``facts``."""
    from fleetctl.facts import collect_facts

    found = collect_facts(mc.session, args.venv or mc.session.vars.get("venv")).to_dict()
    gpus = found.get("gpus") or {}
    summary = f"{found.get('os') or '?'}, {found.get('cpus')} CPUs, {len(gpus.get('gpus') or [])} GPUs"
    return TaskResult(msg=summary, data={"facts": found}, set_vars={"facts": found})
