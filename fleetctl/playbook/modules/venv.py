"""Playbook module ``venv``: ``state: present`` (create from pins, as ``fleetctl venv create``) or
``state: overlay`` (bring another host's distributions in, as ``fleetctl venv overlay``).

Both decide, then do, through the same cores (``fleetctl/venv_create.py``, ``fleetctl/overlay/run.py``):
check mode stops after the plan and reports what would change; otherwise the plan is applied and
``changed`` says whether anything was installed, removed or written.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fleetctl import venv_create as vc
from fleetctl.errors import HostError, InputError
from fleetctl.overlay import run as ov
from fleetctl.overlay.plan import HostPlan, OverlayRequest
from fleetctl.overlay.stream import stream_group
from fleetctl.playbook.modules.base import (
    Args,
    ModuleContext,
    TaskResult,
    key_error,
    module,
    on_other_host,
    once,
    other_host_errors,
)
from fleetctl.transport.base import HostResult, Status

PRESENT_ONLY = ("python", "lock", "requirements", "wheelhouse")
OVERLAY_ONLY = ("source", "to_venv", "packages", "direct", "compress")


class VenvArgs(Args):
    state: Literal["present", "overlay"] = "present"
    venv: str  # the venv on the host (overlay: on the source, and on this host unless to_venv)
    # state: present
    python: str | None = None  # "3.11": python3.11 on the host
    lock: str | None = None  # name==version pins (controller file, relative to the playbook)
    requirements: str | None = None  # a requirements file, resolved by the installer
    wheelhouse: str | None = None  # a controller folder of wheels: uploaded as needed, installed offline
    # state: overlay
    source: str | None = Field(default=None, alias="from")  # the host whose venv is copied
    to_venv: str | None = None
    packages: list[str] = []  # distribution globs; none: every distribution
    direct: bool = False  # this host pulls the stream from the source over its own ssh
    compress: int = Field(default=0, ge=0, le=9)  # zlib level of the stream; 0: none (a LAN outruns zlib)

    @field_validator("venv", "to_venv")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r}: expected an absolute path on the host")
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"3\.\d+", value):
            raise ValueError(f"{value!r}: expected a version such as 3.11")
        return value

    @model_validator(mode="after")
    def _per_state(self) -> VenvArgs:
        given = self.model_fields_set
        wrong = OVERLAY_ONLY if self.state == "present" else PRESENT_ONLY
        for name in wrong:
            if name in given:
                key = "from" if name == "source" else name
                raise key_error("venv", key, f"not an argument of state {self.state}", getattr(self, name))
        if self.state == "present":
            if (self.lock is None) == (self.requirements is None):
                raise ValueError("state present needs exactly one of lock and requirements")
        elif self.source is None:
            raise ValueError("state overlay needs from (the source host)")
        return self


@module("venv", VenvArgs)
def venv(mc: ModuleContext, args: VenvArgs) -> TaskResult:
    """Create a venv holding exactly the pinned set (``state: present``), or overlay another host's
    venv onto this one (``state: overlay``, ``from: HOST``)."""
    return present(mc, args) if args.state == "present" else overlay(mc, args)


# --- state: present ------------------------------------------------------------------------------

def create_request(mc: ModuleContext, args: VenvArgs) -> vc.CreateRequest:
    """Parsed pins and hashed wheels, once per run for all hosts."""
    lock = mc.path(args.lock) if args.lock else None
    reqs = mc.path(args.requirements) if args.requirements else None
    house = mc.path(args.wheelhouse) if args.wheelhouse else None
    key = ("venv-create", args.venv, args.python, str(lock), str(reqs), str(house))
    return once(mc.run, key, lambda: vc.load_request(args.venv, args.python, reqs, lock, house))


def plan_lines(plan: vc.CreatePlan, venv: str) -> str:
    lines = [f"create {venv} ({plan.installer})\n"] if plan.create else []
    lines += [f"+ {spec}\n" for spec in plan.install] + [f"- {name}\n" for name in plan.remove]
    return "".join(lines)


def present(mc: ModuleContext, args: VenvArgs) -> TaskResult:
    req = create_request(mc, args)
    if mc.check:
        state = vc.inspect(mc.session, req)
        vc.check_state(mc.host, req, state)
        outcome = vc.CreateOutcome(vc.plan_create(req, state), state.python_version or "?")
    else:
        outcome = vc.create_on_host(mc.session, req)
    plan = outcome.plan
    data: dict[str, Any] = {"venv": req.venv, **outcome.to_dict()}
    if mc.check:
        data["would_upload"] = [w.filename for w in plan.upload]
    msg = ("would: " if mc.check and plan.changes else "") + outcome.summary()
    return TaskResult(changed=plan.changes, msg=msg, data=data,
                      diff=plan_lines(plan, req.venv) if mc.diff and plan.changes else "")


# --- state: overlay ------------------------------------------------------------------------------

def overlay_request(mc: ModuleContext, args: VenvArgs) -> OverlayRequest:
    assert args.source is not None
    host = mc.run.inventory.hosts.get(args.source)
    if host is None:
        raise InputError(f"from {args.source}: no such host in the inventory")
    if args.direct and host.connection.kind != "ssh":
        raise InputError(f"direct: {args.source} is not reached over ssh, so targets cannot pull from it")
    return OverlayRequest(args.source, args.venv, args.to_venv, tuple(args.packages), mc.check, args.direct,
                          args.compress)


def source_files(mc: ModuleContext, req: OverlayRequest) -> ov.SourceFiles:
    """The source's listing, once per run for every target (its file lists fetched as targets need them)."""
    key = ("overlay-source", req.source, req.venv, req.target_venv, req.packages)

    def listing() -> ov.SourceFiles:
        src = mc.run.session(req.source)
        return ov.SourceFiles(src, req, ov.list_source(src, req))

    return on_other_host(mc, "overlay source", key, listing)


def plan_text(plan: HostPlan) -> str:
    lines = []
    for d in plan.dists:
        if d.changes:
            lines.append(f"{d.action.value} {d.name} {d.old_version or '-'} -> {d.new_version}: {len(d.send)} files "
                         f"({d.send_bytes:,} B) to send, {d.unchanged} unchanged, {len(d.remove)} to remove\n")
    return "".join(lines)


def overlay(mc: ModuleContext, args: VenvArgs) -> TaskResult:
    req = overlay_request(mc, args)
    if req.source == mc.host and req.target_venv == req.venv.rstrip("/"):
        return TaskResult(skipped=True, msg=f"{mc.host} is the overlay source")
    files = source_files(mc, req)
    with other_host_errors(mc, "overlay source"):  # the source's file lists are fetched as needed
        listed = ov.list_target(mc.session, files, req)
    judged = ov.judged(HostResult(mc.host, Status.OK, value=listed))
    assert judged.value is not None
    plan = judged.value.plan
    data: dict[str, Any] = {"source": req.source, "venv": req.target_venv, **plan.to_dict()}
    diff = plan_text(plan) if mc.diff else ""
    if not judged.ok:  # refused: a distribution does not fit this host's interpreter
        return TaskResult(failed=True, msg=judged.reason, data=data, diff=diff)
    if not plan.changes:
        return TaskResult(msg="nothing to change", data=data)
    changed = sum(1 for d in plan.dists if d.changes)
    if mc.check:
        return TaskResult(changed=True, msg=f"would change {changed} distributions", data=data, diff=diff)
    source = mc.run.session(req.source)
    outcome = stream_group(source, [mc.session], files.listing, {mc.host: plan}, req)[mc.host]
    if isinstance(outcome, str):
        raise HostError(mc.host, outcome)
    data["applied"] = outcome.__dict__
    return TaskResult(changed=True, data=data, diff=diff,
                      msg=f"{changed} distributions: {outcome.written} files written, {outcome.removed} removed")
