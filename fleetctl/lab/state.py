"""The lab's on-disk layout and its state file (lab.json): pure data, no processes."""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleetctl.errors import LabError

STATE_VERSION = 1
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
# Paths each lab host gets privately, and the per-host folder bound over each.
PRIVATE_MOUNTS: tuple[tuple[str, str], ...] = (
    ("root", "/root"),
    ("opt", "/opt"),
    ("srv", "/srv"),
    ("var-lib-fleetctl", "/var/lib/fleetctl"),
    ("home", "/home"),
    ("run-sudo", "/run/sudo"),  # sudo's credential cache: per host, like the accounts it caches
)
# Each host's own /etc: a copy of the machine's, made at every start, holding its private
# accounts (see fleetctl.lab.accounts). A whole folder, never single files: a program on the
# machine that replaces /etc/passwd by a rename (adduser, apt) detaches a single-file bind in every
# namespace, and the hosts would then read and write the machine's own account files.
ETC_MOUNT = ("etc", "/etc")


@dataclass(frozen=True)
class LabPaths:
    """Where everything of one lab lives under its folder."""

    directory: Path

    @property
    def state(self) -> Path:
        return self.directory / "lab.json"

    @property
    def inventory(self) -> Path:
        return self.directory / "inventory.yml"

    @property
    def known_hosts(self) -> Path:
        return self.directory / "known_hosts"

    @property
    def client_key(self) -> Path:
        return self.directory / "id_ed25519"

    @property
    def lock(self) -> Path:
        return self.directory / ".lock"

    def host_dir(self, name: str) -> Path:
        return self.directory / "hosts" / name

    def host_key(self, name: str) -> Path:
        return self.host_dir(name) / "ssh_host_ed25519_key"

    def sshd_config(self, name: str) -> Path:
        return self.host_dir(name) / "sshd_config"

    def sshd_log(self, name: str) -> Path:
        return self.host_dir(name) / "sshd.log"

    def host_options(self, name: str) -> Path:
        """Per-host settings that survive restarts (password login on or off)."""
        return self.host_dir(name) / "options.json"


@dataclass
class LabHost:
    """One host as recorded in lab.json; pid 0 means never started or stopped."""

    name: str
    address: str
    pid: int = 0


@dataclass
class LabState:
    """The whole of lab.json."""

    base_address: str
    hosts: list[LabHost] = field(default_factory=list)

    def host(self, name: str) -> LabHost:
        for host in self.hosts:
            if host.name == name:
                return host
        known = ", ".join(h.name for h in self.hosts) or "none"
        raise LabError(f"no lab host named {name!r} (hosts: {known})")


def hidden_by_hosts(path: Path) -> str | None:
    """The private mount that would hide ``path`` from inside a lab host, if any."""
    for _, target in (ETC_MOUNT, *PRIVATE_MOUNTS):
        if path == Path(target) or Path(target) in path.parents:
            return target
    return None


def default_lab_dir(name: str = "lab", cwd: Path | None = None) -> Path:
    """``.fleetctl/NAME`` in the working folder, or under /var/tmp when that folder lies under
    /root, /opt, ... (a checkout in /root is common, and each lab host hides /root)."""
    base = (cwd or Path.cwd()).absolute()
    if hidden_by_hosts(base) is None:
        return base / ".fleetctl" / name
    import hashlib

    return Path("/var/tmp") / f"fleetctl-{hashlib.sha256(str(base).encode()).hexdigest()[:8]}" / name


def resolve_dir(directory: Path | str) -> Path:
    """An absolute lab folder that is not hidden by a host's own private mounts."""
    path = Path(directory).expanduser().absolute()
    hidden = hidden_by_hosts(path)
    if hidden:
        raise LabError(f"the lab folder {path} lies under {hidden}, which each lab host replaces; "
                       "pass --dir elsewhere (e.g. /var/tmp/fleetctl-lab)")
    return path


def host_addresses(base_address: str, count: int) -> list[str]:
    """Host N gets the N-th address after base whose last octet is neither .0 nor .255 (base + N
    up to .254, then on into the next /24s: a lab of 1,000 hosts spans four); refuse anything
    outside 127.0.0.0/8."""
    try:
        base = ipaddress.IPv4Address(base_address)
    except ValueError as exc:
        raise LabError(f"bad base address {base_address!r}: {exc}") from None
    if base not in LOOPBACK:
        raise LabError(f"the base address {base} is outside 127.0.0.0/8: the lab only uses loopback")
    if count < 1:
        raise LabError(f"a lab needs at least one host, not {count}")
    # Number the usable addresses of 127.0.0.0/8 from 0 (254 per /24): the first after base is
    # block * 254 + min(last octet, 254).
    first = int(base) - int(LOOPBACK.network_address)
    start = (first >> 8) * 254 + min(first & 0xFF, 254)
    out = []
    for index in range(start, start + count):
        offset = (index // 254 << 8) + index % 254 + 1
        if offset > 0xFFFFFE:
            raise LabError(f"{count} hosts do not fit after {base} (past 127.255.255.254, the end of loopback)")
        out.append(str(LOOPBACK.network_address + offset))
    return out


def load_state(paths: LabPaths) -> LabState | None:
    """lab.json, or None when there is none; a corrupt file is an error, not silently reset."""
    try:
        raw = json.loads(paths.state.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LabError(f"cannot read {paths.state}: {exc}") from None
    try:
        hosts = [LabHost(str(h["name"]), str(h["address"]), int(h.get("pid", 0))) for h in raw["hosts"]]
        return LabState(base_address=str(raw["base_address"]), hosts=hosts)
    except (KeyError, TypeError, ValueError) as exc:
        raise LabError(f"{paths.state} is malformed ({exc!r}); remove it or run `lab down --purge`") from None


def save_state(paths: LabPaths, state: LabState) -> None:
    """Write lab.json atomically so a killed run never leaves half a file."""
    doc = {"version": STATE_VERSION, "base_address": state.base_address,
           "hosts": [asdict(h) for h in state.hosts]}
    tmp = paths.state.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, paths.state)
