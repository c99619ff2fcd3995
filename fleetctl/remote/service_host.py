# fleetctl-include: writable
# fleetctl-include: port_owner
# fleetctl-include: supervisor
# fleetctl-include: systemd_units
"""The inference service on one host: a systemd unit, or fleetctl's built-in supervisor.

Stdlib only, Python >= 3.8; runs inside the agent. Without systemd (containers, the lab) a start
runs ``supervisor.py`` (kept on the host) in its own session: it starts the server, restarts it
with backoff when it exits, and counts that; a boot entry (BOOT_DIR/NAME, default
/etc/fleetctl/boot.d) starts it again after a reboot. A stop ends the supervisor, then the server
with TERM, then KILL after a timeout; a pid is only signalled when /proc/<pid>/cmdline still shows
the command we started (pids get reused).

params common to all ops: name (``sglang`` or ``sglang@INSTANCE``), state_dir, manager ("systemd" | "process")
  start/restart: command (argv list), env_file (KEY=VALUE lines), cwd, unit (systemd unit text),
                 supervisor_source, boot_dir
  stop: timeout
"""

import errno
import json
import os
import signal
import subprocess
import sys
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


def supervisor_files(params):
    """The supervisor's config, its pidfile and its state (restarts, last exit) for this service."""
    base = os.path.join(service_dir(params), params.get("name") or "sglang")
    return base + ".supervisor.json", base + ".supervisor.pid", base + ".state.json"


def boot_entry(params):
    return os.path.join(params.get("boot_dir") or "/etc/fleetctl/boot.d", params.get("name") or "sglang")


def status(params):
    pidfile, log = paths(params)
    pid, marker = read_pid(pidfile)
    running = bool(pid) and alive(pid, marker)
    config, sup_pidfile, state_file = supervisor_files(params)
    sup_pid, sup_marker = read_pid(sup_pidfile)
    state = read_json_file(state_file) or {}
    port = params.get("port")
    return dict(stored_fields(params), manager="process", running=running, pid=pid if running else None, log=log,
                log_tail=tail(log), supervised=bool(sup_pid) and alive(sup_pid, sup_marker),
                restarts=int(state.get("restarts") or 0), last_exit=state.get("last_exit_text"),
                enabled=os.path.exists(boot_entry(params)),
                # who holds the port: asked by the health gate only when /health answered 200
                listens=listens(pid, port) if running and port and params.get("check_listen") else None)


def stored_fields(params):
    """What the release recorded for this server (its port, health path, argv), for status and gates."""
    return {k: params.get(k) for k in ("release_id", "instance", "port", "health_path", "health_interval", "command")
            if params.get(k) is not None}


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
    journalctl), else the supervisor's log file. Reads only. With ``follow``: no lines, but the
    argv that prints them and then follows (``journalctl -f``; ``tail -F``, which survives the log
    being replaced or truncated), for ``remote/log_follow.py`` to run."""
    lines = max(1, min(int(params.get("lines") or 50), 10000))
    follow = bool(params.get("follow"))
    if manager == "systemd":
        unit = (params.get("name") or "sglang") + ".service"
        argv = ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "short-iso"]
        if params.get("since"):
            argv += ["--since", str(params["since"])]
        if follow:
            return {"source": "journal " + unit, "follow_argv": argv + ["-f"]}
        proc = run(argv, check=False)
        if proc.returncode != 0:
            raise RuntimeError("journalctl exited %d: %s" % (proc.returncode, proc.stderr.strip()[-300:]))
        return {"source": "journal " + unit, "lines": proc.stdout.splitlines()}
    log = paths(params)[1]
    if follow:
        return {"source": log, "exists": os.path.exists(log), "follow_argv": ["tail", "-F", "-n", str(lines), log]}
    return {"source": log, "lines": tail(log, lines), "exists": os.path.exists(log)}


def start(params):
    pidfile, log = paths(params, create=True)
    current = status(params)
    if current["running"] and current["supervised"]:
        return dict(current, started=False)
    if current["supervised"] or current["running"]:
        stop(params)  # a server without its supervisor, or a supervisor waiting out a backoff
    privileges_of(params.get("user"))  # refused here (one line) before anything starts
    config, sup_pidfile, state_file = supervisor_files(params)
    script = os.path.join(service_dir(params), "supervisor.py")
    try:  # each file written whole or not at all; a full state folder is one line, nothing started
        if params.get("supervisor_source"):
            write_file(script, params["supervisor_source"])
        write_file(config, json.dumps({
            "command": [str(c) for c in params["command"]], "env_file": params.get("env_file") or "",
            "cwd": params.get("cwd") or "/", "user": params.get("user"), "log": log, "pidfile": pidfile,
            "supervisor_pidfile": sup_pidfile, "state_file": state_file}), 0o600)
        write_file(state_file, json.dumps({"restarts": 0}))
    except (IOError, OSError) as exc:
        raise_if_full(exc, config)
        raise
    if os.path.exists(pidfile):
        os.unlink(pidfile)
    argv = [sys.executable, script, config]
    with open(log, "ab") as out:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd="/",
                         start_new_session=True, close_fds=True)
    enabled = enable_at_boot(params, argv)
    deadline = time.time() + 15
    pid = None
    while time.time() < deadline:  # the supervisor has started the server (the gates judge it)
        pid, marker = read_pid(pidfile)
        if pid:
            break
        time.sleep(0.02)
    running = bool(pid) and alive(pid, marker)
    return {"manager": "process", "running": running, "pid": pid, "started": True, "log": log, "enabled": enabled}


def enable_at_boot(params, argv):
    """BOOT_DIR/NAME: a shell script the host's boot runs (the lab's init does; on a host without
    systemd, hook the folder into its init). Not written where this user may not: then False."""
    import shlex

    entry = boot_entry(params)
    if not can_write(entry):
        return False
    os.makedirs(os.path.dirname(entry), exist_ok=True)
    write_file(entry, "#!/bin/sh\n# fleetctl: starts the %s server's supervisor at boot\nexec %s\n"
               % (params.get("name") or "sglang", " ".join(shlex.quote(a) for a in argv)), 0o755)
    return True


class DiskFull(Exception):
    """The state folder holding the service's pidfile and log is full."""


def raise_if_full(exc, path):
    if isinstance(exc, (IOError, OSError)) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFull("no space left on device in %s (writing %s); the service was not started"
                       % (os.path.dirname(path), os.path.basename(path)))


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


def stop(params):
    stop_supervisor(params)  # first: it would start the server again
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


def stop_supervisor(params):
    _config, sup_pidfile, _state = supervisor_files(params)
    pid, marker = read_pid(sup_pidfile)
    if not pid or not alive(pid, marker):
        return
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except OSError:
            return
        deadline = time.time() + wait
        while time.time() < deadline and alive(pid, marker):
            reap(pid)
            time.sleep(0.02)
        if not alive(pid, marker):
            return


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


def run(argv, check=True):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    if check and proc.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (" ".join(argv), proc.returncode, proc.stderr.strip()[-300:]))
    return proc
