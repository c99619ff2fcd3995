"""The built-in supervisor of one inference server (hosts without systemd: containers, the lab).

Stdlib only, Python >= 3.8. ``service_host`` includes this file, and also keeps a copy of it on the
host (STATE/service/supervisor.py), started as ``python3 supervisor.py STATE/service/NAME.supervisor.json``:
by ``service_host`` start, and at boot by the host's boot entry (BOOT_DIR/NAME), so a server comes
back after a reboot. The supervisor starts the server in its own session with the release's
environment (re-read at every start), records its pid in NAME.pid, and when it exits restarts it
after a backoff (1 s, doubling to 30 s; back to 1 s after a minute of running), counting restarts
and the last exit in NAME.state.json. SIGTERM ends the supervisor and leaves the server to the
caller (``service_host`` stop signals the server itself). It also ends when its config file is
gone (the service's state was removed) or names another supervisor.

The server's log is rotated by size (config ``log_max_bytes``, default 64 MiB; ``log_keep`` older
files NAME.log.1..N, default 3), checked before each start and every few seconds while it runs:
copied to NAME.log.1 and truncated in place, as logrotate's copytruncate does, because the server
keeps writing to the file it was started with (opened for append, so it writes at the new end).
"""

import json
import os
import signal
import subprocess
import sys
import time

BACKOFF_MIN, BACKOFF_MAX, STEADY_S = 1.0, 30.0, 60.0
LOG_MAX_BYTES, LOG_KEEP, LOG_CHECK_S = 64 * 1024 * 1024, 3, 5.0


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
    """Running, not a zombie, and still the process we started: its cmdline holds ``marker``'s first
    line, or, for a server that rewrote its own cmdline (smg's setproctitle names it ``smg::router``),
    its start time is the ``starttime N`` line recorded when it was started (a reused pid has another)."""
    lines = marker.split("\n")
    started = [line.split(" ", 1)[1] for line in lines[1:] if line.startswith("starttime ")]
    try:
        with open("/proc/%d/stat" % pid, "r") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return False
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            if lines[0].encode() in handle.read():
                return True
        return bool(started) and fields[19] == started[0]  # field 22 of stat: start time in clock ticks
    except (IOError, OSError, IndexError):
        return False


def start_time(pid):
    """The process's start time (field 22 of /proc/PID/stat), or "" when it cannot be read."""
    try:
        with open("/proc/%d/stat" % pid, "r") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (IOError, OSError, IndexError):
        return ""


def read_pid(pidfile):
    """(pid, marker): the marker is every line after the pid (the command, then its start time)."""
    try:
        with open(pidfile, "r") as handle:
            pid, _, marker = handle.read().partition("\n")
        return int(pid), marker.strip()
    except (IOError, OSError, ValueError):
        return None, ""


def write_file(path, text, mode=0o644):
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.rename(tmp, path)


def read_json_file(path):
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def drop_to(user):
    """A preexec function running the server as ``user`` (only root can switch), or None."""
    if not user or os.geteuid() != 0:
        return None
    import pwd

    entry = pwd.getpwnam(user)
    if entry.pw_uid == 0:
        return None

    def demote():  # in the child, before exec: groups, then gid, then uid (after which none can change)
        os.initgroups(entry.pw_name, entry.pw_gid)
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
    return demote


def spawn_server(cfg):
    """Start the server once: its own session (so a stop signals its whole group), output to the log."""
    env = dict(os.environ)
    env.update(read_env(cfg.get("env_file") or ""))
    user = cfg.get("user")
    if user and os.geteuid() == 0:
        import pwd

        entry = pwd.getpwnam(user)
        env.update(HOME=entry.pw_dir, USER=user, LOGNAME=user)
    command = [str(c) for c in cfg["command"]]
    with open(cfg["log"], "ab") as out:
        out.write(("\n--- %s start: %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), " ".join(command))).encode())
        out.flush()
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=cfg.get("cwd") or "/", env=env, start_new_session=True, close_fds=True,
                                preexec_fn=drop_to(user))
    write_file(cfg["pidfile"], "%d\n%s\nstarttime %s\n" % (proc.pid, command[0], start_time(proc.pid)))
    return proc


def rotate_log(cfg):
    """NAME.log over its size limit: the older files shift (.1 -> .2 ...), it is copied to .1 and
    emptied in place. Lines written between the copy and the truncation are lost (a few at most)."""
    import shutil

    path = cfg["log"]
    limit, keep = int(cfg.get("log_max_bytes") or LOG_MAX_BYTES), max(1, int(cfg.get("log_keep") or LOG_KEEP))
    try:
        if os.path.getsize(path) <= limit:
            return False
        for n in range(keep - 1, 0, -1):
            if os.path.exists("%s.%d" % (path, n)):
                os.rename("%s.%d" % (path, n), "%s.%d" % (path, n + 1))
        shutil.copyfile(path, path + ".1")
        os.truncate(path, 0)
    except (IOError, OSError):
        return False  # a full disk or a vanished file: the server keeps running, rotation waits
    return True


def exit_text(code):
    return "signal %d" % -code if code < 0 else "exit code %d" % code


def still_mine(config_path):
    cfg = read_json_file(config_path)
    return cfg is not None and read_pid(cfg["supervisor_pidfile"])[0] == os.getpid()


def wait_server(proc, cfg, stopping):
    """Until the server exits or the supervisor is told to stop, rotating its log as it grows."""
    checked = time.time()
    while proc.poll() is None and not stopping:
        time.sleep(0.2)
        if time.time() - checked >= LOG_CHECK_S:
            rotate_log(cfg)
            checked = time.time()


def supervise(config_path):
    cfg = read_json_file(config_path)
    if cfg is None:
        return 0
    pid, marker = read_pid(cfg["supervisor_pidfile"])
    if pid and pid != os.getpid() and alive(pid, marker):
        return 0  # already supervised (a second boot entry run, or a start racing a boot)
    write_file(cfg["supervisor_pidfile"], "%d\n%s\n" % (os.getpid(), config_path))
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    state = read_json_file(cfg["state_file"]) or {}
    state.update(supervisor_pid=os.getpid(), restarts=int(state.get("restarts") or 0))
    delay = BACKOFF_MIN
    while not stopping and still_mine(config_path):
        started = time.time()
        rotate_log(cfg)
        try:
            proc = spawn_server(cfg)
        except OSError as exc:  # the release's python is gone: try again after the backoff
            proc, code = None, None
            note = "cannot start: %s" % exc
        if proc is not None:
            state.update(pid=proc.pid, started=started)
            write_file(cfg["state_file"], json.dumps(state))
            wait_server(proc, cfg, stopping)
            if stopping:
                break  # the server is the caller's to stop now
            code = proc.returncode
            note = "exited with %s" % exit_text(code)
        if time.time() - started > STEADY_S:
            delay = BACKOFF_MIN
        state.update(restarts=state["restarts"] + 1, last_exit=code, last_exit_text=note, last_exit_at=time.time(),
                     pid=None, backoff=delay)
        write_file(cfg["state_file"], json.dumps(state))
        with open(cfg["log"], "ab") as out:
            out.write(("--- %s supervisor: server %s; restart %d in %gs\n" % (
                time.strftime("%Y-%m-%d %H:%M:%S"), note, state["restarts"], delay)).encode())
        deadline = time.time() + delay
        while time.time() < deadline and not stopping:
            time.sleep(0.1)
        delay = min(delay * 2, BACKOFF_MAX)
    if read_pid(cfg["supervisor_pidfile"])[0] == os.getpid():
        try:
            os.unlink(cfg["supervisor_pidfile"])
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(supervise(sys.argv[1]))
