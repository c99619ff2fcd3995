"""Playbook modules ``systemd`` (any unit: state, enabled, daemon_reload) and ``reboot`` (reboot the
host and wait until it is back), with Ansible's arguments.

``systemd`` asks ``systemctl`` what the unit is now, decides (``plan_systemd``, pure) and only then
acts; check mode stops after deciding. A host without systemd (no ``systemctl``, or systemd not
running as init, as in containers and on the lab's hosts) fails the task with one line saying so.

``reboot`` does what Ansible's does: read the boot id (``boot_time_command``), run
``reboot_command`` detached, drop the connection, reconnect until the boot id differs (within
``reboot_timeout``), then run ``test_command``. On the lab, ``reboot_command:
/etc/fleetctl-lab/restart-this-lab-host`` restarts the lab host (its sshd and everything in it),
and each lab boot has its own boot id (fleetctl/lab/reboot.py).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from fleetctl.errors import HostError
from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module

NO_SYSTEMD = "System has not been booted with systemd"


class SystemdArgs(Args):
    name: str | None = Field(default=None, min_length=1)
    state: Literal["started", "stopped", "restarted", "reloaded"] | None = None
    enabled: bool | None = None
    daemon_reload: bool = False


@dataclass(frozen=True)
class UnitNow:
    active: str  # `systemctl is-active`: active, inactive, failed, ...
    enabled: str  # `systemctl is-enabled`: enabled, disabled, static, ...


@dataclass
class SystemdPlan:
    commands: list[list[str]] = field(default_factory=list)  # systemctl argv tails, in order
    changed: bool = False


def plan_systemd(args: SystemdArgs, now: UnitNow | None) -> SystemdPlan:
    """What must run (pure): ``daemon-reload`` first (not a change), then enable/disable, then the state."""
    plan = SystemdPlan()
    if args.daemon_reload:
        plan.commands.append(["daemon-reload"])
    if args.name is None or now is None:
        return plan
    if args.enabled is not None and (now.enabled == "enabled") != args.enabled:
        plan.commands.append(["enable" if args.enabled else "disable", args.name])
        plan.changed = True
    running = now.active in ("active", "activating", "reloading")
    op = {"started": None if running else "start", "stopped": "stop" if running else None,
          "restarted": "restart", "reloaded": "reload" if running else "start", None: None}[args.state]
    if op:
        plan.commands.append([op, args.name])
        plan.changed = True
    return plan


def _systemctl(mc: ModuleContext, argv: list[str]) -> tuple[int, str]:
    res = mc.session.run(shlex.join(["systemctl", *argv]), timeout=120)
    text = (res.stdout.strip() or res.stderr.strip()).splitlines()
    return res.rc, text[0] if text else ""


@module("systemd", SystemdArgs, free_form="name")
def systemd(mc: ModuleContext, args: SystemdArgs) -> TaskResult:
    """A systemd unit started/stopped/restarted/reloaded, enabled or not; ``daemon_reload``."""
    if args.name is None and not args.daemon_reload:
        raise HostError(mc.host, "systemd: name the unit (or daemon_reload: true)")
    if mc.session.run("command -v systemctl", timeout=30).rc != 0:
        raise HostError(mc.host, "systemd: no systemctl on this host (it does not run systemd)")
    now = None
    if args.name is not None:
        rc, active = _systemctl(mc, ["is-active", args.name])
        if NO_SYSTEMD in active:
            raise HostError(mc.host, f"systemd: systemd is not running on this host ({active})")
        _, enabled = _systemctl(mc, ["is-enabled", args.name])
        now = UnitNow(active, enabled)
    plan = plan_systemd(args, now)
    data = {"name": args.name, "state": now.active if now else None, "enabled": now.enabled if now else None}
    if mc.check:
        todo = ", ".join(" ".join(c) for c in plan.commands if c != ["daemon-reload"])
        return TaskResult(changed=plan.changed, msg=f"would {todo}" if todo else "unchanged", data=data)
    for argv in plan.commands:
        rc, line = _systemctl(mc, argv)
        if rc != 0:
            return TaskResult(failed=True, msg=f"systemctl {' '.join(argv)}: exit {rc}: {line[:300]}", data=data)
    done = ", ".join(" ".join(c) for c in plan.commands)
    return TaskResult(changed=plan.changed, msg=done or "unchanged", data=data)


class RebootArgs(Args):
    reboot_command: str = "shutdown -r now 'Reboot initiated by fleetctl'"
    boot_time_command: str = "cat /proc/sys/kernel/random/boot_id"
    test_command: str = "whoami"
    reboot_timeout: float = Field(default=600.0, gt=0)
    connect_timeout: float = Field(default=10.0, gt=0)
    pre_reboot_delay: float = Field(default=0.0, ge=0)
    post_reboot_delay: float = Field(default=0.0, ge=0)
    msg: str | None = None  # accepted for Ansible's sake; the default command carries its own


def _boot_id(mc: ModuleContext, args: RebootArgs) -> str:
    res = mc.session.run(args.boot_time_command, timeout=args.connect_timeout + 20)
    if res.rc != 0 or not res.stdout.strip():
        raise HostError(mc.host, f"reboot: boot_time_command {args.boot_time_command!r} exit {res.rc}: "
                                 f"{(res.stderr.strip() or 'no output')[:200]}")
    return res.stdout.strip()


def _drop(mc: ModuleContext) -> None:
    try:
        mc.session.close()
    except Exception:  # the host is going down: a broken connection is expected
        pass


@module("reboot", RebootArgs)
def reboot(mc: ModuleContext, args: RebootArgs) -> TaskResult:
    """Reboot the host, wait until it is back with a new boot id, then run ``test_command``."""
    if mc.check:
        return TaskResult(changed=True, msg="would reboot")
    before = _boot_id(mc, args)
    start = time.monotonic()
    # Detached, after a short sleep: the command may take the connection down as it runs.
    detached = f"nohup sh -c {shlex.quote(f'sleep {1 + args.pre_reboot_delay:g}; {args.reboot_command}')}" \
               " >/dev/null 2>&1 </dev/null &"
    mc.session.run(detached, timeout=30)
    _drop(mc)
    last = "the host still runs the same boot"
    while time.monotonic() - start < args.reboot_timeout:
        time.sleep(1.0)
        try:
            now = _boot_id(mc, args)
        except Exception as exc:  # noqa: BLE001  down, or sshd not up yet: any transport error, until the deadline
            last = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            _drop(mc)
            continue
        if now != before:
            break
        _drop(mc)
    else:
        return TaskResult(failed=True, msg=f"reboot: not back with a new boot within {args.reboot_timeout:g}s "
                                           f"(last: {last})")
    if args.post_reboot_delay:
        time.sleep(args.post_reboot_delay)
    test = mc.session.run(args.test_command, timeout=args.connect_timeout + 60)
    elapsed = round(time.monotonic() - start)
    if test.rc != 0:
        return TaskResult(failed=True, msg=f"reboot: back, but test_command exit {test.rc}", data={"elapsed": elapsed})
    return TaskResult(changed=True, msg=f"rebooted, back after {elapsed}s", data={"rebooted": True,
                                                                              "elapsed": elapsed})
