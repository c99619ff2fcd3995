"""The lab fleet: N real sshd hosts on this machine, each in its own mount + UTS namespace.

lab.json records what this lab started; every decision re-checks it against /proc and the
host's port, so stale state from a killed run is judged, never trusted.
"""

from __future__ import annotations

import fcntl
import shutil
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fleetctl.errors import LabError
from fleetctl.lab import boot, files, sshd, systemd_host
from fleetctl.lab.state import (
    LabHost,
    LabPaths,
    LabState,
    host_addresses,
    load_state,
    resolve_dir,
    save_state,
)
from fleetctl.lab.system import ensure_openssh, require_root

UP = "up"
DOWN = "down"


@dataclass(frozen=True)
class LabHostStatus:
    """One host as seen now: state is "up" (our sshd answers) or "down", with why."""

    name: str
    address: str
    pid: int
    state: str
    why: str = ""


@dataclass(frozen=True)
class LabFleet:
    """What lab_up built: where its inventory, key and pinned host keys are, and each host."""

    directory: Path
    base_address: str
    hosts: list[LabHostStatus]
    started: list[str]
    elapsed_s: float

    @property
    def inventory_path(self) -> Path:
        return LabPaths(self.directory).inventory

    @property
    def known_hosts_path(self) -> Path:
        return LabPaths(self.directory).known_hosts

    @property
    def key_path(self) -> Path:
        return LabPaths(self.directory).client_key

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]


@contextmanager
def _locked(paths: LabPaths) -> Iterator[None]:
    """One lab command at a time per folder (two `lab up` runs would race on ports and pids)."""
    paths.directory.mkdir(parents=True, exist_ok=True)
    with open(paths.lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def host_status(paths: LabPaths, host: LabHost) -> LabHostStatus:
    """Judge a host by /proc (alive, not a zombie, our config) and by its SSH banner."""
    def down(why: str) -> LabHostStatus:
        return LabHostStatus(host.name, host.address, host.pid, DOWN, why)

    if host.pid <= 0:
        return down("not running")
    if not sshd.is_our_sshd(host.pid, paths.sshd_config(host.name)):
        if sshd.process_alive(host.pid):
            return down(f"pid {host.pid} now belongs to another process")
        return down(f"pid {host.pid} has exited")
    banner = sshd.answers_ssh(host.address)
    if banner is None:
        return down(f"pid {host.pid} runs but {host.address}:22 sends no SSH banner")
    return LabHostStatus(host.name, host.address, host.pid, UP, banner)


def _plan_state(paths: LabPaths, count: int, base_address: str) -> LabState:
    """The wanted hosts, keeping pids from lab.json where name and address still match."""
    addresses = host_addresses(base_address, count)
    old = load_state(paths)
    if old is not None and old.base_address != base_address:
        running = [h.name for h in old.hosts if host_status(paths, h).state == UP]
        if running:
            raise LabError(f"the lab in {paths.directory} runs on base {old.base_address} "
                           f"({', '.join(running)} up); run `lab down` first to move it to {base_address}")
    keep = {h.name: h for h in old.hosts} if old and old.base_address == base_address else {}
    wanted = [LabHost(f"lab{n}", addr) for n, addr in enumerate(addresses, start=1)]
    for host in wanted:
        if host.name in keep and keep[host.name].address == host.address:
            host.pid = keep.pop(host.name).pid
    for extra in keep.values():  # hosts beyond the new count go away
        sshd.stop_sshd(extra.pid, paths.sshd_config(extra.name))
    return LabState(base_address=base_address, hosts=wanted)


def _adopt_or_clear(paths: LabPaths, host: LabHost) -> bool:
    """True when the host is up (possibly re-adopted); otherwise stop any stray sshd of ours."""
    if host_status(paths, host).state == UP:
        return True
    config = paths.sshd_config(host.name)
    strays = sshd.find_our_sshd(config)
    if len(strays) == 1 and sshd.answers_ssh(host.address):
        host.pid = strays[0]  # ours and answering, but lab.json lost it (a killed or wiped run)
        return True
    for pid in strays:
        sshd.stop_sshd(pid, config)
    host.pid = 0
    return False


def _port_taken(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=0.5):
            return True
    except OSError:
        return False


def _start_hosts(paths: LabPaths, state: LabState, todo: list[LabHost]) -> None:
    """Prepare and start hosts in parallel, record their pids, then wait for every banner."""
    if not todo:
        return
    for host in todo:
        if _port_taken(host.address):
            raise LabError(f"{host.address}:22 is already taken by a process this lab did not start "
                           f"(another lab on the same base address?)")
    with ThreadPoolExecutor(max_workers=min(8, len(todo))) as pool:
        list(pool.map(lambda h: _prepare_host(paths, h), todo))
        for host in todo:
            # A host booted by systemd answers its sshd's pid once systemd started it (lab/systemd_host.py).
            host.pid = (systemd_host.start(paths, host) if systemd_host.wanted(paths, host.name)
                        else sshd.start_sshd(paths, host))
        save_state(paths, state)  # record pids before waiting: a crash must not orphan them
        results = list(pool.map(lambda h: _wait(paths, h), todo))
    errors = [r for r in results if r]
    if errors:
        raise LabError("; ".join(errors))


def _prepare_host(paths: LabPaths, host: LabHost) -> None:
    paths.host_dir(host.name).mkdir(parents=True, exist_ok=True)
    files.ensure_key(paths.host_key(host.name), f"{host.name}-host-key")
    files.prepare_host_dir(paths, host)


def _wait(paths: LabPaths, host: LabHost) -> str:
    try:
        sshd.wait_ready(paths, host)
    except LabError as exc:
        return str(exc)
    return ""


def lab_up(hosts: int, directory: Path | str, base_address: str = "127.0.1.0") -> LabFleet:
    """Bring up lab1..labN (idempotent: hosts already answering are left alone)."""
    started_at = time.monotonic()
    require_root("lab up")
    paths = LabPaths(resolve_dir(directory))
    host_addresses(base_address, hosts)  # refuse a bad base before touching anything
    ensure_openssh()
    with _locked(paths):
        state = _plan_state(paths, hosts, base_address)
        files.ensure_key(paths.client_key, "fleetctl-lab-client")
        files.ensure_mount_points()
        todo = [h for h in state.hosts if not _adopt_or_clear(paths, h)]
        save_state(paths, state)
        _start_hosts(paths, state, todo)
        save_state(paths, state)
        for host in state.hosts:
            boot.mark_lab_host(paths, host.name)
        files.write_inventory(paths, state.hosts)
        files.write_known_hosts(paths, state.hosts)
        statuses = [host_status(paths, h) for h in state.hosts]
    return LabFleet(paths.directory, base_address, statuses, [h.name for h in todo],
                    time.monotonic() - started_at)


def lab_status(directory: Path | str) -> list[LabHostStatus]:
    """Every recorded host, judged now; an empty list when there is no lab in the folder."""
    paths = LabPaths(resolve_dir(directory))
    state = load_state(paths)
    return [host_status(paths, h) for h in state.hosts] if state else []


def lab_down(directory: Path | str, purge: bool = False) -> list[LabHostStatus]:
    """Stop exactly the sshd processes this lab started; keep the folder unless purge."""
    require_root("lab down")
    paths = LabPaths(resolve_dir(directory))
    if not paths.directory.exists():
        return []
    with _locked(paths):
        state = load_state(paths)
        with ThreadPoolExecutor(max_workers=8) as pool:  # each stop mostly waits for its processes to exit
            result = list(pool.map(lambda h: _stop(paths, h), state.hosts)) if state else []
        if state:
            save_state(paths, state)
            from fleetctl.lab import links  # the lab's link shaping goes with it

            links.unshape(paths.directory, {h.name: h.address for h in state.hosts})
        from fleetctl.lab import netfaults  # and its faults' table and relays (its folder names them)

        netfaults.clear(paths.directory)
        if purge and (paths.state.exists() or paths.client_key.exists()):
            shutil.rmtree(paths.directory)
    return result


def _stop(paths: LabPaths, host: LabHost) -> LabHostStatus:
    config = paths.sshd_config(host.name)
    stopped = systemd_host.power_off(paths, host.name)  # a systemd host's init first: a clean shutdown
    stopped += [pid for pid in {host.pid, *sshd.find_our_sshd(config)} if sshd.stop_sshd(pid, config)]
    why = f"stopped pid {', '.join(map(str, sorted(stopped)))}" if stopped else "was not running"
    host.pid = 0
    return LabHostStatus(host.name, host.address, 0, DOWN, why)


def stop_host(directory: Path | str, name: str) -> LabHostStatus:
    """Take one host down (its sshd and everything running inside it)."""
    require_root("stopping a lab host")
    paths = LabPaths(resolve_dir(directory))
    with _locked(paths):
        state = _existing_state(paths)
        status = _stop(paths, state.host(name))
        save_state(paths, state)
    return status


def start_host(directory: Path | str, name: str) -> LabHostStatus:
    """Bring one host back with the same host key and address (no-op when it is up)."""
    require_root("starting a lab host")
    paths = LabPaths(resolve_dir(directory))
    with _locked(paths):
        state = _existing_state(paths)
        host = state.host(name)
        if not _adopt_or_clear(paths, host):
            _start_hosts(paths, state, [host])
        save_state(paths, state)
        return host_status(paths, host)


def rekey_host(directory: Path | str, name: str) -> LabHostStatus:
    """Give a host a new host key and restart it; known_hosts keeps the old key on purpose."""
    require_root("rekeying a lab host")
    paths = LabPaths(resolve_dir(directory))
    with _locked(paths):
        state = _existing_state(paths)
        host = state.host(name)
        _stop(paths, host)
        files.generate_key(paths.host_key(name), f"{name}-host-key-rekeyed")
        _start_hosts(paths, state, [host])
        save_state(paths, state)
        return host_status(paths, host)


def set_password_auth(directory: Path | str, name: str, enabled: bool) -> LabHostStatus:
    """Let one host's sshd accept password logins (fleetop's password: accounts.LAB_PASSWORD,
    set with accounts.set_password) or not; kept in its options.json, the host restarts."""
    require_root("configuring a lab host")
    paths = LabPaths(resolve_dir(directory))
    with _locked(paths):
        state = _existing_state(paths)
        host = state.host(name)
        options = files.read_host_options(paths, name)
        options["password_authentication"] = enabled
        files.write_host_options(paths, name, options)
        _stop(paths, host)
        _start_hosts(paths, state, [host])
        save_state(paths, state)
        return host_status(paths, host)


def _existing_state(paths: LabPaths) -> LabState:
    state = load_state(paths)
    if state is None:
        raise LabError(f"no lab in {paths.directory}: run `fleetctl lab up` first")
    return state


def set_init(directory: Path | str, name: str, systemd: bool = True, hosts: int = 254) -> None:
    """Make one host (of lab1..lab``hosts``) boot under systemd (or the lab's shell init) from its next
    start; a running host under the other init is restarted now."""
    paths = LabPaths(resolve_dir(directory))
    number = name[3:] if name.startswith("lab") and name[3:].isdigit() else ""
    if not number or not 1 <= int(number) <= hosts or number != str(int(number)):
        raise LabError(f"no lab host named {name!r}: the hosts are lab1..lab{hosts}")
    why = systemd_host.usable(paths) if systemd else ""
    if why:
        raise LabError(f"{name}: {why}")
    paths.host_dir(name).mkdir(parents=True, exist_ok=True)
    options = files.read_host_options(paths, name)
    options[systemd_host.INIT_OPTION] = systemd_host.SYSTEMD_INIT if systemd else "sh"
    files.write_host_options(paths, name, options)
    running = [s for s in lab_status(paths.directory) if s.name == name and s.state == "up"]
    if running and bool(systemd_host.running_init(paths, name)) != systemd:
        stop_host(paths.directory, name)
        start_host(paths.directory, name)
