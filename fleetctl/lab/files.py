"""Files a lab writes: keys, per-host folders, sshd_config, inventory.yml and known_hosts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from fleetctl.errors import LabError
from fleetctl.lab import accounts, boot
from fleetctl.lab.state import PRIVATE_MOUNTS, LabHost, LabPaths

SSH_KEYGEN = "/usr/bin/ssh-keygen"
PYTHON = "/usr/bin/python3"
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SSHD_CONFIG = """\
# Written by fleetctl lab for {name}; regenerated on every start.
ListenAddress {address}:22
AddressFamily inet
HostKey {host_key}
PidFile none
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication {password_auth}
KbdInteractiveAuthentication no
AuthenticationMethods {auth_methods}
UsePAM no
StrictModes yes
AuthorizedKeysFile .ssh/authorized_keys
Subsystem sftp internal-sftp
SetEnv PATH={path}
PrintMotd no
PrintLastLog no
UseDNS no
X11Forwarding no
# Tests and fan-outs open many connections at once, and a loaded machine is slow to authenticate
# them: no early random drop (start:rate:full, "kex_exchange_identification: Connection closed")
# below 1000 unauthenticated connections, far above the suite's peak (bench: 32 hosts x workers).
MaxStartups 1000:30:1000
MaxSessions 100
"""


def generate_key(path: Path, comment: str) -> None:
    """A fresh ed25519 key pair at path (+ .pub), replacing any old one."""
    for old in (path, path.with_name(path.name + ".pub")):
        old.unlink(missing_ok=True)
    proc = subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise LabError(f"ssh-keygen for {path} failed: {proc.stderr.strip()}")
    path.chmod(0o600)


def ensure_key(path: Path, comment: str) -> None:
    """Generate the key only once: later runs keep it (and so keep it pinned)."""
    if not (path.exists() and path.with_name(path.name + ".pub").exists()):
        generate_key(path, comment)


def public_key(path: Path) -> str:
    """'ssh-ed25519 AAAA...' of a key pair, without the comment."""
    fields = path.with_name(path.name + ".pub").read_text().split()
    if len(fields) < 2:
        raise LabError(f"{path}.pub is not an OpenSSH public key")
    return f"{fields[0]} {fields[1]}"


def prepare_host_dir(paths: LabPaths, host: LabHost) -> None:
    """Per-host private folders and account files, the client key authorized for root and
    fleetop, and sshd_config (StrictModes-safe modes)."""
    base = paths.host_dir(host.name)
    base.mkdir(parents=True, exist_ok=True)
    for sub, _target in PRIVATE_MOUNTS:
        (base / sub).mkdir(exist_ok=True)
    (base / "run-sudo").chmod(0o711)
    accounts.write_account_files(paths, host, public_key(paths.client_key))
    root = base / "root"
    root.chmod(0o700)
    ssh_dir = root / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    ssh_dir.chmod(0o700)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(public_key(paths.client_key) + " fleetctl-lab\n")
    keys.chmod(0o600)
    password_auth = read_host_options(paths, host.name).get("password_authentication") is True
    config = SSHD_CONFIG.format(name=host.name, address=host.address,
                                host_key=paths.host_key(host.name), path=SESSION_PATH,
                                password_auth="yes" if password_auth else "no",
                                auth_methods="any" if password_auth else "publickey")
    paths.sshd_config(host.name).write_text(config)
    boot.prepare(paths, host.name)  # a new boot id per start; the host's restart command


def read_host_options(paths: LabPaths, name: str) -> dict[str, object]:
    """The host's options.json ({} when there is none)."""
    try:
        doc = json.loads(paths.host_options(name).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise LabError(f"cannot read {paths.host_options(name)}: {exc}") from None
    return doc if isinstance(doc, dict) else {}


def write_host_options(paths: LabPaths, name: str, options: dict[str, object]) -> None:
    _write_atomic(paths.host_options(name), json.dumps(options, indent=2) + "\n")


def ensure_mount_points() -> None:
    """The real machine needs every mount target and sshd's privilege-separation folder."""
    if not os.path.isdir("/run/sudo"):
        os.makedirs("/run/sudo", mode=0o711)  # the mode sudo itself gives it
    for _sub, target in PRIVATE_MOUNTS:
        os.makedirs(target, exist_ok=True)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)


def write_inventory(paths: LabPaths, hosts: list[LabHost]) -> None:
    """An Ansible-style inventory with group `lab`; the key path is relative to its folder."""
    entries = {
        h.name: {
            "ansible_host": h.address,
            "ansible_port": 22,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": paths.client_key.name,
            "ansible_python_interpreter": PYTHON,
            # Lab hosts share this machine's network: each host's service listens on its own address.
            "service_host": h.address,
        }
        for h in hosts
    }
    doc = {"all": {"children": {"lab": {"hosts": entries}}}}
    text = "# Written by `fleetctl lab up`; host keys are pinned in known_hosts next to it.\n"
    text += yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    _write_atomic(paths.inventory, text)


def write_known_hosts(paths: LabPaths, hosts: list[LabHost]) -> None:
    """Each host's key pinned under its plain address (port 22 needs no [addr]:port form)."""
    lines = [f"{h.address} {public_key(paths.host_key(h.name))}\n" for h in hosts]
    _write_atomic(paths.known_hosts, "".join(lines))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
