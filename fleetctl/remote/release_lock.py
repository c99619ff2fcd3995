# Included by release_host.py (`# fleetctl-include: release_lock`): the host's deploy lock, a flock held by
# the agent that took it (for one task, or a rollout's whole run: hold), who holds it when refused, and
# a stale holder ended only on request. Stdlib only, Python >= 3.8; uses release_host's read_json,
# write_json, DiskFull and writable's require_writable at call time.

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import time

_LOCK = {"fd": None, "hold": False, "broke": None}  # hold: a rollout's, kept until its run ends


# --- lock ---------------------------------------------------------------------------------------

def op_lock(params):
    """Take the host's deploy lock for this agent's lifetime; answer who holds it when refused.

    The lock is a flock held by the run's agent: the kernel drops it when that process dies, so a
    dead agent never leaves a lock. An agent outlives its run only while its SSH session does
    (the controller vanished behind a half-open connection, or the agent is busy in a long
    operation when its run was killed). ``break_holder`` (the holding agent's pid and start time,
    as a refusal reported them) ends exactly that agent, after which the lock is taken.
    ``hold``: a rollout's lock, kept by ``unlock`` until its run ends (``end_run``); ``wait``: seconds
    to wait for a held lock to be freed before refusing."""
    state_dir = params["state_dir"]
    require_writable(write_targets(params))  # first: a user who may not deploy changes nothing
    os.makedirs(state_dir, exist_ok=True)
    if _LOCK["fd"] is not None:
        _LOCK["hold"] = _LOCK["hold"] or bool(params.get("hold"))
        return {"locked": True, "broke": _LOCK["broke"]} if _LOCK["broke"] else {"locked": True}
    path = os.path.join(state_dir, "deploy.lock")
    broke, deadline = None, 0.0
    wait_until = time.time() + float(params.get("wait") or 0)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except (IOError, OSError) as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
        holder = read_json(path + ".holder") or {}
        holder["agent_alive"] = process_start(holder.get("agent_pid")) not in (None, "")
        wanted = params.get("break_holder") or {}
        if broke is None and holder["agent_alive"] and wanted.get("agent_pid") == holder.get("agent_pid") \
                and wanted.get("agent_start") == holder.get("agent_start"):
            broke = holder
            end_process(holder["agent_pid"], holder["agent_start"])
            deadline = time.time() + 10
            continue
        if broke is not None and time.time() < deadline:
            time.sleep(0.05)  # the flock goes when the process has exited
            continue
        if broke is None and time.time() < wait_until:
            time.sleep(0.2)  # --wait: the holder's run ends and its flock goes
            continue
        os.close(fd)
        return {"locked": False, "holder": holder}
    holder = dict(params.get("holder") or {}, agent_pid=os.getpid(), agent_start=process_start(os.getpid()),
                  since=time.time())
    try:
        write_json(path + ".holder", holder)
    except BaseException as exc:
        os.close(fd)  # not held without its holder record: the next run must not find a nameless lock
        if disk_full(exc):
            raise DiskFull(full_message(path + ".holder", "nothing changed"))
        raise
    _LOCK.update(fd=fd, hold=bool(params.get("hold")), broke=broke)
    return {"locked": True, "broke": broke} if broke else {"locked": True}


def write_targets(params):
    """Every folder a deploy or rollback under this lock writes: [path, purpose, host var]."""
    state_dir = params["state_dir"]
    targets = [[state_dir, "deploy lock", "fleetctl_state_dir"],
               [params["root"], "releases and current", "fleetctl_root"]]
    manager = params.get("manager") or ("systemd" if os.path.isdir("/run/systemd/system") else "process")
    if manager == "systemd":
        targets.append(["/etc/systemd/system", "systemd unit", None])
    else:
        targets.append([os.path.join(state_dir, "service"), "service pid and log", "fleetctl_state_dir"])
    return targets


def process_start(pid):
    """A process's start time in clock ticks (field 22 of /proc/PID/stat), or None when it is gone:
    with the pid it names one process, never a later one that reused the pid."""
    try:
        with open("/proc/%d/stat" % int(pid), "r") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (IOError, OSError, TypeError, ValueError):
        return None
    return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields[19]  # a zombie has exited


def end_process(pid, start):
    """SIGTERM, then SIGKILL after 5 s, to exactly that process (pid and start time)."""
    import signal

    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if process_start(pid) != start:
            return
        try:
            os.kill(pid, sig)
        except OSError:
            return
        deadline = time.time() + wait
        while time.time() < deadline and process_start(pid) == start:
            time.sleep(0.05)


def op_unlock(params):
    """Free the lock; a rollout's (``hold``) only when its run ends (``end_run``)."""
    if _LOCK["hold"] and not params.get("end_run"):
        return {"locked": True}
    if _LOCK["fd"] is not None:
        path = os.path.join(params["state_dir"], "deploy.lock.holder")
        if os.path.exists(path):
            os.unlink(path)  # before the flock goes: a waiting run never reads a stale holder
        os.close(_LOCK["fd"])  # closing the descriptor releases the flock
        _LOCK.update(fd=None, hold=False, broke=None)
    return {"locked": False}


# --- inspect ------------------------------------------------------------------------------------
