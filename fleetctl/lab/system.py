"""What the real machine must offer a lab: root, OpenSSH and sudo (installed through apt if missing)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fleetctl.errors import LabError
from fleetctl.lab.files import SSH_KEYGEN
from fleetctl.lab.sshd import SSHD, UNSHARE

# Keeps apt from starting the distribution's sshd on 0.0.0.0:22, which would take every lab port.
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
SUDO = "/usr/bin/sudo"


def require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise LabError(f"the lab needs root: {action} needs mount namespaces and port 22 (run as root)")


def ensure_openssh() -> None:
    """Install openssh-server when sshd or ssh-keygen is missing, sudo when it is (the lab user
    fleetop has sudo); unshare must already be there."""
    if not Path(UNSHARE).exists():
        raise LabError(f"the lab needs {UNSHARE} (util-linux)")
    if Path(SSHD).exists() and Path(SSH_KEYGEN).exists() and Path(SUDO).exists():
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    made_policy = not POLICY_RC_D.exists()
    if made_policy:
        POLICY_RC_D.write_text("#!/bin/sh\nexit 101\n")
        POLICY_RC_D.chmod(0o755)
    try:
        for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "openssh-server", "sudo"]):
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
                raise LabError(f"`{' '.join(argv)}` exited {proc.returncode}: {tail}")
    finally:
        if made_policy:
            POLICY_RC_D.unlink(missing_ok=True)
    for needed in (SSHD, SUDO):
        if not Path(needed).exists():
            raise LabError(f"openssh-server and sudo are installed but {needed} is still missing")
