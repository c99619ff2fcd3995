"""Start, judge and stop one lab host's sshd, always by the pid this lab recorded.

A pid is trusted only when /proc says it is alive (not a zombie) and its command line names
sshd and this host's config path: pids are reused, so `kill -0` alone proves nothing.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

from fleetctl.errors import LabError
from fleetctl.lab.state import ETC_MOUNT, PRIVATE_MOUNTS, LabHost, LabPaths

SSHD = "/usr/sbin/sshd"
UNSHARE = "/usr/bin/unshare"
PROC_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
STOP_GRACE_S = 3.0
# How long a live sshd of ours may take to send its banner before "is it up" says no: on a loaded
# machine accepting and forking can take seconds, and a host judged down is restarted under the
# tests using it: lab up once restarted lab1 while other tests ran on it.
BANNER_PATIENCE_S = 15.0
# Children this process started, kept so they can be reaped (no zombies, no ResourceWarning).
_children: dict[int, subprocess.Popen[bytes]] = {}


def _read_proc(pid: int, name: str) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return None


def process_alive(pid: int) -> bool:
    """True while pid exists and is not a zombie (an exited but unreaped process)."""
    if pid <= 0:
        return False
    status = _read_proc(pid, "status")
    if status is None:
        return False
    for line in status.decode(errors="replace").splitlines():
        if line.startswith("State:"):
            return line.split()[1:2] != ["Z"]
    return False


def is_our_sshd(pid: int, config: Path) -> bool:
    """Alive, and running sshd with exactly this host's config (not a reused pid)."""
    if not process_alive(pid):
        return False
    raw = _read_proc(pid, "cmdline")
    if raw is None:
        return False
    # The listener retitles itself "sshd: /usr/sbin/sshd -D -e -f CONFIG [listener] ...".
    line = raw.replace(b"\0", b" ").decode(errors="replace")
    tokens = line.split()
    if tokens[:1] == ["sshd:"]:
        tokens = tokens[1:]
    # "-R" marks a per-connection re-exec'd child, not the listener.
    return (bool(tokens) and tokens[0].endswith("/sshd") and f" {config} " in f"{line} "
            and "-R" not in tokens)


def find_our_sshd(config: Path) -> list[int]:
    """Listeners running this config that lab.json lost track of (a killed or wiped earlier run)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and is_our_sshd(int(entry.name), config):
            found.append(int(entry.name))
    return sorted(found)


def read_banner(address: str, timeout: float = 1.0) -> str | None:
    """The SSH identification line at address:22, or None when nothing SSH answers."""
    try:
        with socket.create_connection((address, 22), timeout=timeout) as sock:
            data = sock.recv(256)
    except OSError:
        return None
    line = data.split(b"\n", 1)[0].strip().decode("ascii", errors="replace")
    return line if line.startswith("SSH-") else None


def answers_ssh(address: str, patience: float = BANNER_PATIENCE_S) -> str | None:
    """``read_banner``, tried again (each try waiting longer) until ``patience`` runs out. Only for
    a host whose sshd /proc already shows alive: this asks "is it up", never "is it fast"."""
    deadline = time.monotonic() + patience
    wait = 1.0
    while True:
        left = deadline - time.monotonic()
        banner = read_banner(address, timeout=max(0.1, min(wait, left)))
        if banner is not None or left <= 0:
            return banner
        time.sleep(min(0.2, max(0.0, left)))
        wait = min(wait * 2, 5.0)


# The lab host's "init": at start (a boot, after a stop) it runs every executable in this folder of
# the host's own /etc, as a host's boot would (fleetctl's supervisor puts its boot entries there).
BOOT_DIR = "/etc/fleetctl/boot.d"


def host_script(paths: LabPaths, host: LabHost) -> str:
    """The shell run inside the new namespaces: its own /etc and private folders, hostname, the boot
    entries (in the background), then exec sshd."""
    base = paths.host_dir(host.name)
    steps = ["set -e"]
    for sub, target in (ETC_MOUNT, *PRIVATE_MOUNTS):
        steps.append(f"mount --bind {shlex.quote(str(base / sub))} {shlex.quote(target)}")
    # Each lab boot has its own boot id (lab/reboot.py): what a reboot is judged by.
    boot_id = shlex.quote(str(base / "boot_id"))
    steps.append(f"[ -f {boot_id} ] && mount --bind {boot_id} /proc/sys/kernel/random/boot_id || true")
    steps.append(f"hostname {shlex.quote(host.name)}")
    steps.append(f'for f in {BOOT_DIR}/*; do if [ -x "$f" ]; then setsid "$f" </dev/null >/dev/null 2>&1 & fi; done')
    steps.append(f"exec {SSHD} -D -e -f {shlex.quote(str(paths.sshd_config(host.name)))}")
    return "\n".join(steps)


def start_sshd(paths: LabPaths, host: LabHost) -> int:
    """Launch the host; unshare and sh both exec, so the pid returned is sshd's own."""
    argv = [UNSHARE, "--mount", "--uts", "--propagation", "private", "sh", "-c", host_script(paths, host)]
    with open(paths.sshd_log(host.name), "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=PROC_ENV, start_new_session=True, close_fds=True)
    _children[proc.pid] = proc
    return proc.pid


def log_tail(paths: LabPaths, name: str, lines: int = 5) -> str:
    try:
        text = paths.sshd_log(name).read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())


def wait_ready(paths: LabPaths, host: LabHost, timeout: float = 20.0) -> None:
    """Block until our sshd accepts TCP and sends its banner; fail fast if it died."""
    config = paths.sshd_config(host.name)
    deadline = time.monotonic() + timeout
    delay = 0.01
    while time.monotonic() < deadline:
        # Before its exec the pid is still unshare/sh: only an exit is fatal.
        if not process_alive(host.pid):
            reap(host.pid)
            raise LabError(f"{host.name}: sshd (pid {host.pid}) exited at start: "
                           f"{log_tail(paths, host.name) or 'no log'}")
        if is_our_sshd(host.pid, config) and read_banner(host.address, timeout=1.0):
            return
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    raise LabError(f"{host.name}: no SSH banner on {host.address}:22 after {timeout:.0f}s: "
                   f"{log_tail(paths, host.name) or 'no log'}")


def reap(pid: int) -> None:
    """Collect the exit status of a child of this process so it does not linger as a zombie."""
    proc = _children.pop(pid, None)
    if proc is not None:
        try:
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            _children[pid] = proc


def _mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _namespace_members(ns: str, exclude: int) -> list[int]:
    """Every other process inside a host's private mount namespace (its sessions and their work)."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != exclude and _mount_ns(int(entry.name)) == ns:
            members.append(int(entry.name))
    return members


def stop_sshd(pid: int, config: Path) -> bool:
    """SIGTERM, then SIGKILL after a grace period; False when pid was not our sshd."""
    if not is_our_sshd(pid, config):
        reap(pid)
        return False
    ns = _mount_ns(pid)
    # Only our sshd ever enters this namespace, so its members are the host's own processes.
    members = _namespace_members(ns, pid) if ns and ns != _mount_ns(os.getpid()) else []
    _signal_all([pid, *members], signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        reap(pid)
        if not any(process_alive(p) and _mount_ns(p) == ns for p in [pid, *members]):
            return True
        time.sleep(0.05)
    _signal_all([p for p in [pid, *members] if _mount_ns(p) == ns], signal.SIGKILL)
    reap(pid)
    return True


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
