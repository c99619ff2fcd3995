# fleetctl-include: writable
"""The inference service on one host: a systemd unit, or a built-in process supervisor.

Stdlib only, Python >= 3.8; runs inside the agent. The supervisor (hosts without systemd:
containers, the lab) starts the command in its own session (setsid) with a pidfile and a log
file, and stops it with TERM, then KILL after a timeout; a pid is only signalled when
/proc/<pid>/cmdline still shows the command we started (pids get reused).

params common to all ops: name (service name), state_dir, manager ("systemd" | "process")
  start/restart: command (argv list), env_file (KEY=VALUE lines), cwd, unit (systemd unit text)
  stop: timeout
"""

import errno
import os
import signal
import subprocess
import time


def main(params):
    params = with_release_params(params)
    op = params.get("op")
    manager = params.get("manager") or detect()
    if op == "detect":
        return {"manager": detect()}
    if op == "logs":
        return logs(params, manager)
    handler = {"start": start, "stop": stop, "restart": restart, "status": status}.get(op)
    if handler is None:
        raise ValueError("unknown service op %r" % (op,))
    if manager == "systemd":
        return systemd(op, params)
    return handler(params)


def with_release_params(params):
    """A release folder's ``service.json`` supplies command, env file and unit: a restart after any
    switch (deploy or rollback) runs exactly what the now-current release was built with."""
    path = params.get("params_file")
    if not path or (params.get("op") not in ("start", "restart") and not os.path.exists(path)):
        return params  # status/stop of a host with no release yet: nothing stored to read
    import json

    with open(path, "r", encoding="utf-8") as handle:
        stored = json.load(handle)
    merged = dict(stored)
    merged.update((k, v) for k, v in params.items() if v is not None)
    return merged


def detect():
    """systemd when it is PID 1's init (its runtime folder exists), else the built-in supervisor."""
    return "systemd" if os.path.isdir("/run/systemd/system") else "process"


def service_dir(params):
    return os.path.join(params["state_dir"], "service")


def paths(params, create=False):
    """The pidfile and log; only a start makes their folder (status and stop write nothing)."""
    folder = service_dir(params)
    if create:
        require_writable([[folder, "service pid and log", "fleetctl_state_dir"]])
        os.makedirs(folder, exist_ok=True)
    name = params.get("name") or "sglang"
    return os.path.join(folder, name + ".pid"), os.path.join(folder, name + ".log")


def unquote(value):
    """A value as systemd's EnvironmentFile reads it: shell-style quotes removed, nothing expanded."""
    import shlex

    try:
        return " ".join(shlex.split(value, comments=False, posix=True))
    except ValueError:
        return value


def read_env(path):
    env = {}
    try:
        with open(path, "r", encoding="utf-8") as handle:
            for line in handle:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    key, _, value = line.partition("=")
                    env[key.strip()] = unquote(value)
    except (IOError, OSError):
        pass
    return env


def alive(pid, marker):
    """Running, not a zombie, and still the process we started (its cmdline holds ``marker``)."""
    try:
        with open("/proc/%d/stat" % pid, "r") as handle:
            if handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return False
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return marker.encode() in handle.read()
    except (IOError, OSError, IndexError):
        return False


def read_pid(pidfile):
    try:
        with open(pidfile, "r") as handle:
            pid, _, marker = handle.read().partition("\n")
        return int(pid), marker.strip()
    except (IOError, OSError, ValueError):
        return None, ""


def status(params):
    pidfile, log = paths(params)
    pid, marker = read_pid(pidfile)
    running = bool(pid) and alive(pid, marker)
    return {"manager": "process", "running": running, "pid": pid if running else None, "log": log,
            "log_tail": tail(log)}


def tail(path, lines=15):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - max(8192, lines * 400)))
            return handle.read().decode("utf-8", "replace").splitlines()[-lines:]
    except (IOError, OSError):
        return []


def logs(params, manager):
    """The server's last ``lines`` log lines: its journal under systemd (``since`` passed to
    journalctl), else the supervisor's log file. Reads only."""
    lines = max(1, min(int(params.get("lines") or 50), 10000))
    if manager == "systemd":
        unit = (params.get("name") or "sglang") + ".service"
        argv = ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "short-iso"]
        if params.get("since"):
            argv += ["--since", str(params["since"])]
        proc = run(argv, check=False)
        if proc.returncode != 0:
            raise RuntimeError("journalctl exited %d: %s" % (proc.returncode, proc.stderr.strip()[-300:]))
        return {"source": "journal " + unit, "lines": proc.stdout.splitlines()}
    log = paths(params)[1]
    return {"source": log, "lines": tail(log, lines), "exists": os.path.exists(log)}


def start(params):
    pidfile, log = paths(params, create=True)
    current = status(params)
    if current["running"]:
        return dict(current, started=False)
    env = dict(os.environ)
    env.update(read_env(params.get("env_file") or ""))
    command = [str(c) for c in params["command"]]
    drop = privileges_of(params.get("user"))
    if drop:
        env.update(HOME=drop[3], USER=params["user"], LOGNAME=params["user"])
    try:
        with open(log, "ab") as out:
            out.write(("\n--- %s start: %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), " ".join(command))).encode())
            out.flush()
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=params.get("cwd") or "/", env=env, start_new_session=True, close_fds=True,
                                    preexec_fn=become_user(drop) if drop else None)
    except (IOError, OSError) as exc:
        raise_if_full(exc, log)
        raise
    marker = command[0]
    try:
        write_pidfile(pidfile, "%d\n%s\n" % (proc.pid, marker))
    except BaseException as exc:
        # A service nobody can find by its pidfile would run on untracked: end it, say why.
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        raise_if_full(exc, pidfile)
        raise
    return {"manager": "process", "running": True, "pid": proc.pid, "started": True, "log": log}


class DiskFull(Exception):
    """The state folder holding the service's pidfile and log is full."""


def raise_if_full(exc, path):
    if isinstance(exc, (IOError, OSError)) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFull("no space left on device in %s (writing %s); the service was not started"
                       % (os.path.dirname(path), os.path.basename(path)))


def write_pidfile(path, text):
    """Written whole under a temporary name, then renamed: never an empty or cut pidfile."""
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "w") as handle:
            handle.write(text)
        os.rename(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def privileges_of(user):
    """(uid, gid, name, home) to run the service as (the spec's service.user), or None to keep ours.
    Only root can switch; another user may run it as itself."""
    if not user:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError("service.user %s: no such user on this host" % user)
    if entry.pw_uid == os.geteuid():
        return None
    if os.geteuid() != 0:
        raise NotPermitted("cannot run the service as %s while logged in as %s: run with --become (-b)"
                           % (user, login_name()))
    return entry.pw_uid, entry.pw_gid, entry.pw_name, entry.pw_dir


def become_user(drop):
    uid, gid, name, _home = drop

    def demote():  # in the child, before exec: groups, then gid, then uid (after which none can change)
        os.initgroups(name, gid)
        os.setgid(gid)
        os.setuid(uid)
    return demote


def stop(params):
    pidfile, _log = paths(params)
    pid, marker = read_pid(pidfile)
    if not pid or not alive(pid, marker):
        return {"manager": "process", "stopped": False, "running": False}
    deadline = time.time() + float(params.get("timeout") or 30)
    signal_group(pid, signal.SIGTERM)
    while time.time() < deadline and alive(pid, marker):
        reap(pid)
        time.sleep(0.05)
    killed = alive(pid, marker)
    if killed:
        signal_group(pid, signal.SIGKILL)
        for _ in range(100):
            reap(pid)
            if not alive(pid, marker):
                break
            time.sleep(0.05)
    return {"manager": "process", "stopped": True, "killed": killed, "running": alive(pid, marker)}


def signal_group(pid, sig):
    try:
        os.killpg(pid, sig)  # the service and anything it started (it leads its own session)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def reap(pid):
    try:
        os.waitpid(pid, os.WNOHANG)  # our child when this agent started it: do not leave a zombie
    except OSError:
        pass


def restart(params):
    paths(params, create=True)  # refused before the running service is stopped
    stopped = stop(params)
    started = start(params)
    return dict(started, stopped=stopped.get("stopped", False), killed=stopped.get("killed", False))


SYSTEMD_UNITS = "/etc/systemd/system"


def systemd(op, params):
    unit = (params.get("name") or "sglang") + ".service"
    if op != "status" and os.geteuid() != 0:  # systemctl on a system unit needs root
        if op in ("start", "restart") and params.get("unit"):
            require_writable([[os.path.join(SYSTEMD_UNITS, unit), "systemd unit", None]])
        raise NotPermitted("cannot %s %s as %s (systemctl needs root): run with --become (-b)"
                           % (op, unit, login_name()))
    if op in ("start", "restart") and params.get("unit"):
        path = os.path.join(SYSTEMD_UNITS, unit)
        with open(path + ".tmp", "w") as handle:
            handle.write(params["unit"])
        os.rename(path + ".tmp", path)
        run(["systemctl", "daemon-reload"])
        run(["systemctl", "enable", unit])  # comes back after a reboot (the unit's [Install] section)
    if op == "status":
        proc = run(["systemctl", "is-active", unit], check=False)
        return {"manager": "systemd", "running": proc.stdout.strip() == "active", "state": proc.stdout.strip()}
    run(["systemctl", op, unit])
    return {"manager": "systemd", "running": op != "stop"}


def run(argv, check=True):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    if check and proc.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (" ".join(argv), proc.returncode, proc.stderr.strip()[-300:]))
    return proc
