"""The peers fleetctl is measured against, each in its own throwaway venv under .cache/bench-peers/.

Never a dependency of fleetctl: the bench installs them from PyPI on first use (a venv that
already answers `--version` with the pinned series is reused) and writes each peer's config
for a lab: ansible-core in its best configuration, pyinfra with the lab's pinned host keys.

    .venv/bin/python bench/peers.py          # create or check both venvs, print their versions
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / ".cache" / "bench-peers"
# ansible-core 2.19.x is what pip gives on Python 3.11 (2.20+ needs 3.12 on the controller).
REQUIREMENTS = {"ansible": "ansible-core>=2.19,<2.20", "pyinfra": "pyinfra>=3.5,<4"}
PYTHON = "/usr/bin/python3"
# ansible-core's newest series (2.21) beside 2.19 (bench/scale.py): its controller needs Python 3.12,
# which this machine has from pyenv; its venv is ansible-2.21/, its tool `ansible`.
NEWEST = {"ansible-2.21": ("ansible-core>=2.21,<2.22", "/root/.pyenv/versions/3.12.1/bin/python3")}
TOOL = {"ansible-2.21": "ansible"}


def venv_bin(peer: str, tool: str) -> Path:
    return PEERS / peer / "bin" / tool


def version(peer: str) -> str:
    """The peer's own version line, or "" when its venv is missing or broken."""
    tool = venv_bin(peer, TOOL.get(peer, peer))
    if not tool.exists():
        return ""
    proc = subprocess.run([str(tool), "--version"], capture_output=True, text=True)
    return proc.stdout.splitlines()[0].strip() if proc.returncode == 0 and proc.stdout else ""


def ensure(peer: str) -> str:
    """Create the peer's venv from PyPI unless a working one is there; return its version line."""
    have = version(peer)
    if have:
        return have
    folder = PEERS / peer
    requirement, python = NEWEST.get(peer, (REQUIREMENTS.get(peer, ""), sys.executable))
    print(f"bench: installing {requirement} into {folder}", flush=True)
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    subprocess.run([python, "-m", "venv", str(folder)], check=True)
    subprocess.run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    requirement], check=True)
    have = version(peer)
    if not have:
        raise RuntimeError(f"{peer} installed but `{peer} --version` does not answer")
    return have


def ensure_all() -> dict[str, str]:
    return {peer: ensure(peer) for peer in REQUIREMENTS}


# -- ansible-core --------------------------------------------------------------------------------

def ansible_setup(lab_dir: Path, addresses: list[str], workdir: Path) -> dict[str, str]:
    """An INI inventory and ansible.cfg for the lab; returns the environment to run `ansible` in.

    Its best configuration: forks >= hosts, pipelining, ControlPersist, no fact gathering, the
    interpreter named (no discovery), host key checking on against the lab's known_hosts, and
    the key exchange paramiko negotiates (curve25519) instead of OpenSSH's costlier default.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    inv = workdir / "hosts.ini"
    lines = ["[lab]"]
    lines += [f"lab{n} ansible_host={a}" for n, a in enumerate(addresses, start=1)]
    lines += ["", "[lab:vars]", "ansible_user=root", f"ansible_python_interpreter={PYTHON}",
              f"ansible_ssh_private_key_file={lab_dir / 'id_ed25519'}"]
    inv.write_text("\n".join(lines) + "\n")
    control = PEERS / "cp"  # short: ControlPath must fit a unix socket name
    control.mkdir(parents=True, exist_ok=True)
    ssh_args = (f"-F /dev/null -o ControlMaster=auto -o ControlPersist=120s -o KexAlgorithms=curve25519-sha256 "
                f"-o UserKnownHostsFile={lab_dir / 'known_hosts'} -o StrictHostKeyChecking=yes -o BatchMode=yes")
    cfg = workdir / "ansible.cfg"
    cfg.write_text("\n".join([
        "[defaults]", f"inventory = {inv}", f"forks = {max(len(addresses), 5)}", "gathering = explicit",
        "host_key_checking = True", "interpreter_python = " + PYTHON, "retry_files_enabled = False",
        "stdout_callback = ansible.builtin.minimal", "deprecation_warnings = False", "",
        "[ssh_connection]", "pipelining = True", f"ssh_args = {ssh_args}",
        f"control_path_dir = {control}", "control_path = %(directory)s/%%h", "",
    ]))
    return {**os.environ, "ANSIBLE_CONFIG": str(cfg), "ANSIBLE_LOCAL_TEMP": str(workdir / "tmp"),
            "ANSIBLE_HOME": str(workdir / "home"), "ANSIBLE_NOCOLOR": "1"}


def ansible_argv(workdir: Path, script: Path, python: str, peer: str = "ansible") -> list[str]:
    """Ad hoc: `ansible all -m script` runs the shared script file under ``python`` on every host
    (``peer``: which venv's ansible, "ansible" for 2.19 or "ansible-2.21")."""
    return [str(venv_bin(peer, "ansible")), "all", "-o", "-i", str(workdir / "hosts.ini"), "-m", "script",
            "-a", f"{shlex.quote(str(script))} executable={shlex.quote(python)}"]


# -- pyinfra -------------------------------------------------------------------------------------

def pyinfra_setup(lab_dir: Path, addresses: list[str], workdir: Path) -> Path:
    """A pyinfra inventory module for the lab: key, pinned known_hosts, strict checking."""
    workdir.mkdir(parents=True, exist_ok=True)
    inv = workdir / "inventory.py"
    data = {"ssh_user": "root", "ssh_key": str(lab_dir / "id_ed25519"),
            "ssh_known_hosts_file": str(lab_dir / "known_hosts"), "ssh_strict_host_key_checking": "yes"}
    hosts = [(f"lab{n}", {"ssh_hostname": a}) for n, a in enumerate(addresses, start=1)]
    inv.write_text(f"lab = ({hosts!r}, {data!r})\n")
    return inv


def pyinfra_argv(inventory: Path, script: Path, python: str, hosts: int) -> list[str]:
    """`pyinfra INV exec -- PY -c SOURCE`: pyinfra has no "run this local script" for exec, so
    the shared script travels inside the command line (as -c), run by ``python`` on every host."""
    command = f"{shlex.quote(python)} -c {shlex.quote(script.read_text())}"
    return [str(venv_bin("pyinfra", "pyinfra")), "-y", "--parallel", str(max(hosts, 1)), str(inventory),
            "exec", "--", command]


if __name__ == "__main__":
    for name, line in ensure_all().items():
        print(f"{name}: {line}")
