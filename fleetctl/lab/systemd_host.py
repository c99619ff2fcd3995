"""A lab host whose init is a real systemd (PID 1 of its own PID namespace), not a shell.

Chosen per host (``init: systemd`` in its options.json: ``fleet.set_init``, ``lab up --systemd-host``). The
host is the lab's usual one (its own /etc copy, private /root /opt /srv /var/lib/fleetctl /home, its own loopback
address) plus a PID, cgroup and UTS namespace, and systemd 252 boots it: journald and the D-Bus
system bus, then the host's sshd as a unit, then whatever fleetctl enabled (``multi-user.target.wants``).

What keeps the machine safe (a first try without it booted the machine's default target: its sshd
took 0.0.0.0:22 and tmpfiles emptied the shared /tmp):
- tmpfs over /run, /tmp, /var/tmp and /var/log/journal before systemd starts;
- ``SYSTEMD_UNIT_PATH`` is the host's own /etc/systemd/system (a folder of the lab bound there), which
  holds only the units below; generators see an empty folder; journald keeps its journal in /run;
- its own cgroup (a cgroup namespace rooted at ``fleetctl-lab/<lab>-<host>``), so two systemd hosts
  never share a unit's cgroup; /dev/console is a log file of the host.
Every step before systemd runs is ``set -e``: a mount that fails ends the boot, systemd never starts
without them. Stopped by asking its init to power off (SIGRTMIN+4), then SIGKILL to it (which ends its
namespace).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

from fleetctl.errors import LabError
from fleetctl.lab import files, sshd
from fleetctl.lab.boot import RESTART_COMMAND
from fleetctl.lab.state import ETC_MOUNT, PRIVATE_MOUNTS, LabHost, LabPaths

SYSTEMD = "/lib/systemd/systemd"
INIT_OPTION, SYSTEMD_INIT = "init", "systemd"
SSHD_UNIT = "fleetctl-lab-sshd.service"
MACHINE_UNITS = Path("/lib/systemd/system")
# Units copied from the machine (targets and the power-off path): nothing that mounts, cleans, listens on
# a network or touches a device. The journal's own service is written below without dev-log/audit sockets.
COPIED_UNITS = tuple(f"{t}.target" for t in (
    "basic", "sysinit", "sockets", "multi-user", "local-fs", "network", "network-online", "paths", "slices",
    "timers", "shutdown", "poweroff", "reboot", "halt", "final", "umount", "exit")) + tuple(
    f"systemd-{s}.service" for s in ("poweroff", "reboot", "halt", "exit")) + (
    "systemd-journald.socket", "dbus.socket", "dbus.service")  # the system bus: systemctl as a non-root user needs it
JOURNALD_UNIT = """\
# Written by fleetctl lab: systemd's journal, without the /dev/log and audit sockets (/dev is the machine's).
[Unit]
Description=Journal Service
DefaultDependencies=no
Requires=systemd-journald.socket
After=systemd-journald.socket
Before=sysinit.target
IgnoreOnIsolate=yes

[Service]
Type=notify
ExecStart=/lib/systemd/systemd-journald
Sockets=systemd-journald.socket
Restart=always
RestartSec=0
RuntimeDirectory=systemd/journal
RuntimeDirectoryPreserve=yes
StandardOutput=null
FileDescriptorStoreMax=4224
"""
SSHD_UNIT_TEXT = """\
# Written by fleetctl lab: this lab host's sshd, on its own address only.
[Unit]
Description=OpenSSH server of lab host {name}

[Service]
ExecStart={sshd} -D -e -f {config}
RuntimeDirectory=sshd
RuntimeDirectoryPreserve=yes
KillMode=process
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
"""
# `systemctl reboot` (and `shutdown -r`) on the host, once every unit has stopped, asks the lab for a
# restart (served by lab/reboot.py serve_restarts), then systemd ends the host's PID namespace.
REBOOT_DROP_IN = f"""\
# Written by fleetctl lab: a reboot of this host is a restart by the lab.
[Service]
Type=oneshot
ExecStart={RESTART_COMMAND}
"""
# Folders systemd would touch on the machine's disk were they not replaced in the host.
TMPFS = (("/run", "755"), ("/tmp", "1777"), ("/var/tmp", "1777"))
GENERATORS = ("/usr/lib/systemd/system-generators", "/lib/systemd/system-generators")
BOOT_TIMEOUT_S = 120.0
POWEROFF_TIMEOUT_S = 60.0


def wanted(paths: LabPaths, name: str) -> bool:
    """Whether this host boots under systemd (its options.json says ``init: systemd``)."""
    return files.read_host_options(paths, name).get(INIT_OPTION) == SYSTEMD_INIT


def usable(paths: LabPaths) -> str:
    """Why no systemd host can start here ("" when one can)."""
    if not os.access(SYSTEMD, os.X_OK):
        return f"a systemd lab host needs {SYSTEMD} (apt-get install systemd)"
    for target, _mode in TMPFS:
        if paths.directory == Path(target) or Path(target) in paths.directory.parents:
            return (f"the lab folder {paths.directory} lies under {target}, which a systemd lab host "
                    "replaces with its own tmpfs; pass --dir elsewhere")
    if cgroup2_root() is None:
        return "a systemd lab host needs a cgroup2 hierarchy (/sys/fs/cgroup or /sys/fs/cgroup/unified)"
    return ""


def cgroup2_root() -> Path | None:
    """The machine's cgroup2 mount: /sys/fs/cgroup (unified) or /sys/fs/cgroup/unified (hybrid)."""
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (root / "cgroup.procs").exists() and (root / "cgroup.controllers").exists():
            return root
    return None


def host_cgroup(paths: LabPaths, name: str) -> Path:
    """This host's own cgroup: one per lab folder and host, so hosts of two labs never share one."""
    root = cgroup2_root() or Path("/sys/fs/cgroup")
    lab = hashlib.sha256(str(paths.directory).encode()).hexdigest()[:10]
    return root / "fleetctl-lab" / f"{lab}-{name}"


def units_dir(paths: LabPaths, name: str) -> Path:
    """The host's /etc/systemd/system: kept across its restarts (what fleetctl enabled survives a reboot)."""
    return paths.host_dir(name) / "systemd-units"


def console_log(paths: LabPaths, name: str) -> Path:
    return paths.host_dir(name) / "console.log"


def init_file(paths: LabPaths, name: str) -> Path:
    """The running init's pid (as this machine sees it) and its start time: a pid alone may be reused."""
    return paths.host_dir(name) / "init.pid"


def write_units(paths: LabPaths, host: LabHost) -> None:
    """The base units (rewritten at each start) beside whatever fleetctl installed there (kept)."""
    folder = units_dir(paths, host.name)
    for sub in ("multi-user.target.wants", "sockets.target.wants"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    for unit in COPIED_UNITS:
        if (MACHINE_UNITS / unit).exists():
            shutil.copyfile(MACHINE_UNITS / unit, folder / unit)
    (folder / "systemd-journald.service").write_text(JOURNALD_UNIT)
    (folder / "systemd-reboot.service.d").mkdir(exist_ok=True)
    (folder / "systemd-reboot.service.d" / "fleetctl-lab.conf").write_text(REBOOT_DROP_IN)
    config = str(paths.sshd_config(host.name))
    (folder / SSHD_UNIT).write_text(SSHD_UNIT_TEXT.format(name=host.name, sshd=sshd.SSHD,
                                                          config=exec_word(config)))
    _link(folder / "default.target", "multi-user.target")
    _link(folder / "multi-user.target.wants" / SSHD_UNIT, f"/etc/systemd/system/{SSHD_UNIT}")
    _link(folder / "sockets.target.wants" / "systemd-journald.socket", "/etc/systemd/system/systemd-journald.socket")
    if (folder / "dbus.socket").exists():
        _link(folder / "sockets.target.wants" / "dbus.socket", "/etc/systemd/system/dbus.socket")


def exec_word(word: str) -> str:
    """One ExecStart word, double-quoted by systemd's rules (specifiers and variables kept literal)."""
    if any(ord(c) < 32 for c in word):
        raise LabError(f"{word!r} cannot be an ExecStart word (a control character)")
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def _link(path: Path, target: str) -> None:
    if path.is_symlink() and os.readlink(path) == target:
        return
    path.unlink(missing_ok=True)
    path.symlink_to(target)


def write_etc(paths: LabPaths, host: LabHost) -> None:
    """In the host's fresh /etc copy: its own machine id (kept), hostname, and a journal kept in /run."""
    etc = paths.host_dir(host.name) / ETC_MOUNT[0]
    machine_id = paths.host_dir(host.name) / "machine-id"
    if not machine_id.exists():
        machine_id.write_text(uuid.uuid4().hex + "\n")
    (etc / "machine-id").write_text(machine_id.read_text())
    (etc / "hostname").write_text(host.name + "\n")
    conf = etc / "systemd" / "journald.conf.d"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "fleetctl-lab.conf").write_text("# fleetctl lab: never the machine's /var/log/journal or kernel log\n"
                                            "[Journal]\nStorage=volatile\nReadKMsg=no\n")


def boot_script(paths: LabPaths, host: LabHost) -> str:
    """Run inside the new namespaces: private tmpfs and cgroup2 first, the lab's binds, then exec systemd."""
    base = paths.host_dir(host.name)
    q = shlex.quote
    steps = ["set -e"]
    steps += [f"mount -t tmpfs -o mode={mode},nosuid,nodev tmpfs {target}" for target, mode in TMPFS]
    steps.append("if [ -d /var/log/journal ]; then mount -t tmpfs -o mode=2755 tmpfs /var/log/journal; fi")
    steps.append("mkdir -p /run/sudo /run/sshd && chmod 711 /run/sudo")
    steps.append("mount -t cgroup2 cgroup2 /sys/fs/cgroup")
    for sub, target in (ETC_MOUNT, *PRIVATE_MOUNTS):
        steps.append(f"mount --bind {q(str(base / sub))} {q(target)}")
    steps.append(f"[ -f {q(str(base / 'boot_id'))} ] && mount --bind {q(str(base / 'boot_id'))} "
                 "/proc/sys/kernel/random/boot_id || true")
    steps.append(f"mount --bind {q(str(units_dir(paths, host.name)))} /etc/systemd/system")
    empty = base / "empty"
    steps += [f"if [ -d {g} ]; then mount --bind {q(str(empty))} {g}; fi" for g in GENERATORS]
    steps.append(f"mount --bind {q(str(console_log(paths, host.name)))} /dev/console")
    steps.append(f"hostname {q(host.name)}")
    steps.append(f"exec env -i container=fleetctl-lab SYSTEMD_UNIT_PATH=/etc/systemd/system "
                 f"PATH={q(sshd.PROC_ENV['PATH'])} LANG=C.UTF-8 {SYSTEMD} --log-target=journal")
    return "\n".join(steps)


def start(paths: LabPaths, host: LabHost) -> int:
    """Boot the host under systemd; answers the pid of its sshd once systemd has started it."""
    why = usable(paths)
    if why:
        raise LabError(f"{host.name}: {why}")
    write_units(paths, host)
    write_etc(paths, host)
    (paths.host_dir(host.name) / "empty").mkdir(exist_ok=True)
    console_log(paths, host.name).write_bytes(b"")
    cgroup = host_cgroup(paths, host.name)
    cgroup.mkdir(parents=True, exist_ok=True)
    outer = (f"echo $$ > {shlex.quote(str(cgroup / 'cgroup.procs'))} && exec {sshd.UNSHARE} --pid --fork "
             f"--mount --uts --cgroup --propagation private --mount-proc sh -c {shlex.quote(boot_script(paths, host))}")
    with open(paths.sshd_log(host.name), "ab") as log:
        proc = subprocess.Popen(["sh", "-c", outer], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=sshd.PROC_ENV, start_new_session=True, close_fds=True)
    sshd._children[proc.pid] = proc
    try:
        return _wait_for_sshd(paths, host, proc.pid)
    except LabError:
        power_off(paths, host.name)
        raise


def _wait_for_sshd(paths: LabPaths, host: LabHost, unshare_pid: int) -> int:
    """Record the init once unshare forked it, then wait for the sshd systemd starts in its namespace."""
    config = paths.sshd_config(host.name)
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    recorded = 0
    while time.monotonic() < deadline:
        if not sshd.process_alive(unshare_pid):
            sshd.reap(unshare_pid)
            raise LabError(f"{host.name}: systemd exited at boot: {_boot_log_tail(paths, host.name)}")
        init = _child_of(unshare_pid)
        if init and init != recorded:  # recorded first: a stop must find it even if the boot fails
            init_file(paths, host.name).write_text(f"{init} {_start_time(init)} {unshare_pid}\n")
            recorded = init
        namespace = _mount_ns(unshare_pid)
        if namespace == _mount_ns(os.getpid()):  # unshare has not made the host's namespaces yet
            namespace = None
        for pid in sshd.find_our_sshd(config):
            if init and namespace and _mount_ns(pid) == namespace:
                return pid
        time.sleep(0.2)
    raise LabError(f"{host.name}: systemd did not start sshd within {BOOT_TIMEOUT_S:.0f}s: "
                   f"{_boot_log_tail(paths, host.name)}")


def _boot_log_tail(paths: LabPaths, name: str) -> str:
    text = " | ".join(filter(None, (sshd.log_tail(paths, name), _tail(console_log(paths, name)))))
    return text or "no log"


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(line.strip() for line in path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _child_of(pid: int) -> int:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0
    return int(children[0]) if children else 0


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def running_init(paths: LabPaths, name: str) -> int:
    """The pid of this host's systemd while it runs (0 when none): the recorded pid, still the same
    process (its start time) and still systemd."""
    try:
        pid_text, started = init_file(paths, name).read_text().split()[:2]
        pid = int(pid_text)
    except (OSError, ValueError):
        return 0
    if not sshd.process_alive(pid) or _start_time(pid) != started:
        return 0
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return 0
    return pid if comm in ("systemd", "systemd-shutdow") else 0  # the latter: its last step, shutting down


def power_off(paths: LabPaths, name: str) -> list[int]:
    """Shut the host down as a power-off would (units stopped in order); SIGKILL to its init when that
    hangs, which ends every process of its PID namespace. Answers the init's pid when one ran."""
    pid = running_init(paths, name)
    if pid:
        os.kill(pid, signal.SIGRTMIN + 4)  # systemd(1): starts poweroff.target
        if not _wait_exit(pid, POWEROFF_TIMEOUT_S):
            os.kill(pid, signal.SIGKILL)
            _wait_exit(pid, 10.0)
    try:  # unshare, when this process started it: collected, never left a zombie
        sshd.reap(int(init_file(paths, name).read_text().split()[2]))
    except (OSError, ValueError, IndexError):
        pass
    init_file(paths, name).unlink(missing_ok=True)
    _remove_cgroup(host_cgroup(paths, name))
    return [pid] if pid else []


def _wait_exit(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not sshd.process_alive(pid):
            return True
        time.sleep(0.1)
    return not sshd.process_alive(pid)


def _remove_cgroup(cgroup: Path) -> None:
    """The host's cgroup folders, deepest first (cgroupfs removes only empty ones, and only by rmdir)."""
    if not cgroup.is_dir():
        return
    for folder in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()
        except OSError:
            pass
    for folder in (cgroup, cgroup.parent):  # the shared parent goes once no lab host uses it
        try:
            folder.rmdir()
        except OSError:
            pass
