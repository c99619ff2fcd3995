"""Helpers for tests that run against the lab fleet's real sshd hosts.

`LabHandle` wraps one lab folder: real `ssh`/`sftp` with strict host-key checking against the
lab's pinned known_hosts, and stop/start/rekey that can restore the host afterwards.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import yaml

from fleetctl.lab import (
    LabFleet,
    LabPaths,
    accounts,
    lab_down,
    lab_status,
    lab_up,
    rekey_host,
    set_password_auth,
    start_host,
    stop_host,
)
from fleetctl.lab.accounts import LAB_PASSWORD
from fleetctl.lab.sshd import UNSHARE
from fleetctl.lab.state import default_lab_dir

REPO = Path(__file__).resolve().parent.parent
# Under pytest-xdist (`make pytest` runs two workers) each worker is its own pytest session with
# its own labs: a folder suffix and a second octet of its own, so workers never share a host.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_WORKER_INDEX = int(WORKER[2:]) if WORKER.startswith("gw") and WORKER[2:].isdigit() else 0


def worker_lab_dir(name: str) -> Path:
    """A lab folder of this checkout and this xdist worker (outside REPO when REPO is under /root)."""
    return default_lab_dir(f"{name}-{WORKER}" if WORKER else name, REPO)


SESSION_LAB_DIR = worker_lab_dir("test-lab")
# A second octet per checkout and worker: two clones testing at once (or a CI clone beside a
# working tree) never fight over addresses; a lab started by hand stays on 127.0.1.x.
# 250 octets (2..251) rather than 100: seven worktrees on 100 clashed.
_NET = 2 + (int(hashlib.sha256(str(REPO).encode()).hexdigest(), 16) + _WORKER_INDEX) % 250
SESSION_LAB_BASE = f"127.{_NET}.77.0"
SESSION_LAB_HOSTS = 3
SCRATCH_LAB_DIR = worker_lab_dir("test-lab-scratch")
SCRATCH_LAB_BASE = f"127.{_NET}.78.0"
SCRATCH_LAB_HOSTS = 2


def lab_usable() -> str:
    """Why the lab cannot run here, or "" when it can.

    FLEETCTL_TEST_UNSHARE points this check at another unshare (tests/test_skip_guard.py points it
    at a missing one to show that a run without the lab fails).
    """
    unshare = os.environ.get("FLEETCTL_TEST_UNSHARE", UNSHARE)
    if os.geteuid() != 0:
        return "the lab needs root"
    if not os.access(unshare, os.X_OK):
        return f"the lab needs {unshare} (util-linux)"
    return ""


class Restorer:
    """Returned by stop/rekey: a plain call leaves the host so; `with` restores it on exit."""

    def __init__(self, handle: LabHandle, name: str) -> None:
        self.handle = handle
        self.name = name

    def __enter__(self) -> Restorer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.handle.restore(self.name)


@dataclass
class LabHandle:
    """One running lab, as tests see it."""

    dir: Path
    base_address: str
    hosts: list[str]
    addresses: dict[str, str]
    _pinned: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    _dirty: set[str] = field(default_factory=set)

    @classmethod
    def from_fleet(cls, fleet: LabFleet) -> LabHandle:
        handle = cls(fleet.directory, fleet.base_address, fleet.names,
                     {h.name: h.address for h in fleet.hosts})
        paths = LabPaths(fleet.directory)
        for name in handle.hosts:
            key = paths.host_key(name)
            handle._pinned[name] = (key.read_bytes(), key.with_name(key.name + ".pub").read_bytes())
        return handle

    @property
    def inventory_path(self) -> Path:
        return LabPaths(self.dir).inventory

    @property
    def known_hosts(self) -> Path:
        return LabPaths(self.dir).known_hosts

    @property
    def key_path(self) -> Path:
        return LabPaths(self.dir).client_key

    def pids(self) -> dict[str, int]:
        return {s.name: s.pid for s in lab_status(self.dir)}

    def ssh_options(self) -> list[str]:
        """Strict host-key checking against the lab's pinned keys, never the user's own files."""
        return ["-F", "/dev/null", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=5",
                "-i", str(self.key_path)]

    def ssh(
        self, name: str, command: str, check: bool = True, timeout: float = 300, user: str = "root"
    ) -> subprocess.CompletedProcess[str]:
        argv = ["ssh", *self.ssh_options(), f"{user}@{self.addresses[name]}", command]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check)

    def sftp(self, name: str, batch: str) -> subprocess.CompletedProcess[str]:
        argv = ["sftp", *self.ssh_options(), "-b", "-", f"root@{self.addresses[name]}"]
        return subprocess.run(argv, input=batch, capture_output=True, text=True, timeout=30, check=False)

    def stop(self, name: str) -> Restorer:
        self._dirty.add(name)
        stop_host(self.dir, name)
        return Restorer(self, name)

    def start(self, name: str) -> None:
        start_host(self.dir, name)

    def rekey(self, name: str) -> Restorer:
        self._dirty.add(name)
        rekey_host(self.dir, name)
        return Restorer(self, name)

    @contextmanager
    def links(self, rate: float) -> Iterator[None]:
        """Every host's upload and download capped at ``rate`` bytes/s (fleetctl/lab/links.py) for a block."""
        from fleetctl.lab import links

        links.shape(self.dir, self.addresses, links.LinkSpec(rate))
        try:
            yield
        finally:
            links.unshape(self.dir, self.addresses)

    def restore(self, name: str | None = None) -> None:
        """Bring host(s) back up with the key pinned at setup (undoes stop and rekey)."""
        for host in [name] if name else sorted(self._dirty):
            key = LabPaths(self.dir).host_key(host)
            private, public = self._pinned[host]
            if key.read_bytes() != private:
                stop_host(self.dir, host)
                key.write_bytes(private)
                key.with_name(key.name + ".pub").write_bytes(public)
            start_host(self.dir, host)
            self._dirty.discard(host)


def user_inventory(lab: LabHandle, path: Path, user: str = accounts.LAB_USER,
                   host_vars: dict[str, dict[str, object]] | None = None) -> Path:
    """A copy of the lab's inventory at ``path`` that logs in as ``user`` (key and known_hosts by
    absolute path), with extra vars per host (``host_vars``)."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    for name, entry in doc["all"]["children"]["lab"]["hosts"].items():
        entry.update(ansible_user=user, ansible_ssh_private_key_file=str(lab.key_path),
                     fleetctl_known_hosts=str(lab.known_hosts), **(host_vars or {}).get(name, {}))
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def set_sudo(lab: LabHandle, host: str, mode: str) -> None:
    """fleetop's sudo on one host, at once: "passwordless" (the default), "password" (password
    LAB_PASSWORD, no requiretty, nothing cached), "none" (not in sudoers; the password is set so
    sudo -S gets as far as saying so) or "requiretty"."""
    accounts.set_sudo(LabPaths(lab.dir), host, mode)


@contextmanager
def sudo_mode(lab: LabHandle, host: str, mode: str) -> Iterator[None]:
    """set_sudo for the body of a with block, then back to passwordless."""
    set_sudo(lab, host, mode)
    try:
        yield
    finally:
        set_sudo(lab, host, accounts.PASSWORDLESS)


@contextmanager
def password_login(lab: LabHandle, host: str, password: str | None = LAB_PASSWORD) -> Iterator[None]:
    """fleetop may log in to one host with this password (sshd restarts, so does everything on it);
    afterwards key-only again and no password (a start rewrites the host's account files, so the
    password is set after the restart)."""
    set_password_auth(lab.dir, host, True)
    accounts.set_password(LabPaths(lab.dir), host, password)
    try:
        yield
    finally:
        set_password_auth(lab.dir, host, False)
        accounts.set_password(LabPaths(lab.dir), host, None)


@contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _start_time(pid: int) -> str:
    """A process's start time (field 22 of /proc/pid/stat): tells a live user from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


@contextmanager
def shared_lab(directory: Path, hosts: int, base_address: str) -> Iterator[LabHandle]:
    """A lab shared by concurrent pytest runs: the last one to leave takes it down."""
    users = directory.parent / f"{directory.name}.users"
    me = users / f"{os.getpid()}-{_start_time(os.getpid())}"
    with _flock(users.with_suffix(".lock")):
        users.mkdir(parents=True, exist_ok=True)
        me.touch()
        handle = LabHandle.from_fleet(lab_up(hosts, directory, base_address))
    try:
        yield handle
    finally:
        with _flock(users.with_suffix(".lock")):
            handle.restore()
            me.unlink(missing_ok=True)
            for other in users.iterdir():  # forget runs that died without cleaning up
                pid, _, started = other.name.partition("-")
                if not pid.isdigit() or _start_time(int(pid)) != started:
                    other.unlink()
            if not any(users.iterdir()):
                lab_down(directory)


@contextmanager
def private_lab(directory: Path, hosts: int, base_address: str) -> Iterator[LabHandle]:
    """A lab one test owns outright (destructive tests); purged afterwards."""
    with _flock(directory.parent / f"{directory.name}.lock"):
        lab_down(directory, purge=True)  # whatever a killed run left behind
        try:
            yield LabHandle.from_fleet(lab_up(hosts, directory, base_address))
        finally:
            lab_down(directory, purge=True)
            shutil.rmtree(directory, ignore_errors=True)


def _listen_inodes(addresses: set[str] | None = None) -> dict[str, tuple[str, int]]:
    """Listening TCP sockets on this machine: inode -> (IPv4 address, port)."""
    found: dict[str, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_addr[-8:])[::-1]
            address = ".".join(str(b) for b in raw) if len(hex_addr) == 8 else f"v6:{hex_addr}"
            if addresses is None or address in addresses:
                found[fields[9]] = (address, int(hex_port, 16))
    return found


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """Which (address, port) the process pid listens on."""
    listening = _listen_inodes()
    mine = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in listening:
            mine.append(listening[target[8:-1]])
    return sorted(mine)


def listeners_on(addresses: set[str]) -> list[tuple[str, int]]:
    """Every listening socket bound to one of these addresses, whoever owns it."""
    return sorted(_listen_inodes(addresses).values())


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited: gone from /proc, or a zombie not yet reaped (orphans are reaped
    late here, so a stopped process can linger as one that kill -0 still reports alive)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # the latter: it exited between open and read
        return True
    return state in ("Z", "X")


def wait_gone(pids: list[int], seconds: float = 10) -> list[int]:
    """The pids still running after waiting up to ``seconds`` for all of them to exit."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(process_gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not process_gone(p)]


def unhealthy_release_spec(folder: Path) -> Path:
    """A release of the stand-in server (the GPU server's test double) whose /health answers 503:
    its health gate always fails."""
    spec = folder / "sick.yml"
    spec.write_text(
        'name: sick\nversion: "1"\nbase: {adopt: /root/ml-env}\n'
        'service:\n  standin: true\n  args: [--standin-health-status, "503"]\n'
        "health: {timeout: 3, interval: 0.2}\n"
    )
    return spec


def host_processes(lab: LabHandle, name: str) -> list[int]:
    """Every process of one lab host: its sshd (the pid lab.json records) and everything in its
    private mount namespace (sessions, agents, commands, services)."""
    sshd = lab.pids()[name]
    ns = os.readlink(f"/proc/{sshd}/ns/mnt")
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "ns" / "mnt") == ns:
                found.append(int(entry.name))
        except OSError:
            continue  # exited while we looked
    return sorted(found)


def host_running(lab: LabHandle, name: str, argv: list[str]) -> list[int]:
    """The processes of one lab host whose command line is exactly ``argv``."""
    want = "\0".join(argv) + "\0"
    found = []
    for pid in host_processes(lab, name):
        try:
            if Path(f"/proc/{pid}/cmdline").read_text() == want:
                found.append(pid)
        except OSError:
            continue
    return found
