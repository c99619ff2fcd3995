"""Each lab host's private accounts: passwd, group, shadow, sudoers and sudoers.d, hosts.

Every host gets its own /etc, a copy of this machine's made at each start and bound over /etc in
its mount namespace, with the non-root user ``fleetop`` added, so users and sudo rules made for
tests never touch the machine itself. Files are rewritten in place (same inode), so a running
host sees a change at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from fleetctl.errors import LabError
from fleetctl.lab.state import ETC_MOUNT, LabHost, LabPaths

LAB_USER = "fleetop"
LAB_UID = 2400  # also the gid of its own group
LAB_HOME = f"/home/{LAB_USER}"
# The one password of the lab user: for password-only sudo and (when enabled) ssh password login.
LAB_PASSWORD = "fleetop-lab-password"
OPENSSL = "/usr/bin/openssl"

PASSWORDLESS = "passwordless"
PASSWORD = "password"
NONE = "none"
REQUIRETTY = "requiretty"
SUDO_MODES = (PASSWORDLESS, PASSWORD, NONE, REQUIRETTY)
_SUDOERS_FILE = LAB_USER  # sudo skips names with a dot or ending in ~
_SUDO_RULES = {
    PASSWORDLESS: f"{LAB_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n",
    # No cached credential: every sudo asks, so a wrong password is always found wrong.
    PASSWORD: (f"Defaults:{LAB_USER} !requiretty, timestamp_timeout=0\n"
               f"{LAB_USER} ALL=(ALL:ALL) ALL\n"),
    NONE: "",
    REQUIRETTY: f"Defaults:{LAB_USER} requiretty\n{LAB_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n",
}
# "*" is no valid hash (no password login) but, unlike "!", does not lock the account: sshd
# without PAM refuses even key logins for a locked one.
_NO_PASSWORD = "*"


def etc_dir(paths: LabPaths, name: str) -> Path:
    return paths.host_dir(name) / ETC_MOUNT[0]


def _read_machine(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError as exc:
        raise LabError(f"cannot read {path} to copy it into the lab hosts: {exc}") from None


def _without_user(lines: list[str], machine_file: str) -> list[str]:
    """The machine's lines minus any fleetop entry; a clash on its uid/gid is refused."""
    kept = []
    for line in lines:
        fields = line.split(":")
        if fields[0] == LAB_USER:
            continue
        if machine_file in ("/etc/passwd", "/etc/group") and len(fields) > 2 and fields[2] == str(LAB_UID):
            raise LabError(f"{machine_file} of this machine already uses id {LAB_UID} ({fields[0]}); "
                           f"the lab user {LAB_USER} needs it")
        kept.append(line)
    return kept


def _join(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def password_hash(password: str) -> str:
    """A SHA-512 crypt hash of password (openssl reads it on stdin, never from argv)."""
    proc = subprocess.run([OPENSSL, "passwd", "-6", "-stdin"], input=password, capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.startswith("$6$"):
        raise LabError(f"openssl passwd failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()


def _shadow_text(password_field: str) -> str:
    lines = _without_user(_read_machine("/etc/shadow"), "/etc/shadow")
    return _join([*lines, f"{LAB_USER}:{password_field}:20000:0:99999:7:::"])


def _write_in_place(path: Path, text: str, mode: int) -> None:
    """Rewrite a file keeping its inode (a running host has it bind-mounted)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, mode)
    with os.fdopen(fd, "w") as handle:
        handle.truncate(0)
        handle.write(text)
    os.chown(path, 0, 0)
    os.chmod(path, mode)


def write_account_files(paths: LabPaths, host: LabHost, client_public_key: str) -> None:
    """The host's own /etc before it starts: the machine's, plus fleetop with passwordless sudo."""
    etc = etc_dir(paths, host.name)
    # What fleetctl itself keeps in the host's /etc (the supervisor's boot entries) survives a
    # restart, as a real host's /etc survives a reboot; the rest is the machine's again.
    kept = etc.parent / f".{etc.name}-fleetctl"
    if (etc / "fleetctl").is_dir():
        shutil.rmtree(kept, ignore_errors=True)
        (etc / "fleetctl").rename(kept)
    if etc.exists():
        shutil.rmtree(etc)
    copied = subprocess.run(["cp", "-a", "--no-target-directory", "/etc", str(etc)], capture_output=True,
                            text=True, check=False)
    if copied.returncode != 0:
        raise LabError(f"cannot copy /etc for lab host {host.name}: {copied.stderr.strip()}")
    if kept.is_dir():
        shutil.rmtree(etc / "fleetctl", ignore_errors=True)
        kept.rename(etc / "fleetctl")
    passwd = _without_user(_read_machine("/etc/passwd"), "/etc/passwd")
    passwd.append(f"{LAB_USER}:x:{LAB_UID}:{LAB_UID}:fleetctl lab user:{LAB_HOME}:/bin/bash")
    group = _without_user(_read_machine("/etc/group"), "/etc/group")
    group.append(f"{LAB_USER}:x:{LAB_UID}:")
    hosts = [*_read_machine("/etc/hosts"), f"{host.address} {host.name}"]  # sudo resolves its host
    _write_in_place(etc / "passwd", _join(passwd), 0o644)
    _write_in_place(etc / "group", _join(group), 0o644)
    _write_in_place(etc / "shadow", _shadow_text(_NO_PASSWORD), 0o640)
    _write_in_place(etc / "hosts", _join(hosts), 0o644)
    (etc / "sudoers.d").mkdir(mode=0o755, exist_ok=True)
    _write_sudo_rule(paths, host.name, PASSWORDLESS)
    _write_home(paths, host.name, client_public_key)


def _write_home(paths: LabPaths, name: str, client_public_key: str) -> None:
    home = paths.host_dir(name) / "home" / LAB_USER
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(client_public_key + " fleetctl-lab\n")
    for path, mode in ((home, 0o750), (ssh_dir, 0o700), (keys, 0o600)):
        os.chown(path, LAB_UID, LAB_UID)
        os.chmod(path, mode)


def _write_sudo_rule(paths: LabPaths, name: str, mode: str) -> None:
    rule = etc_dir(paths, name) / "sudoers.d" / _SUDOERS_FILE
    if _SUDO_RULES[mode]:
        _write_in_place(rule, f"# fleetctl lab: sudo mode {mode}\n{_SUDO_RULES[mode]}", 0o440)
    else:
        rule.unlink(missing_ok=True)


def set_password(paths: LabPaths, name: str, password: str | None) -> None:
    """Give fleetop on one host this password (None: no password at all)."""
    field = password_hash(password) if password is not None else _NO_PASSWORD
    _write_in_place(etc_dir(paths, name) / "shadow", _shadow_text(field), 0o640)


def set_sudo(paths: LabPaths, name: str, mode: str) -> None:
    """One host's sudo for fleetop: passwordless | password (LAB_PASSWORD) | none (not in
    sudoers; the password is set, so sudo -S gets as far as saying so) | requiretty.
    Takes effect at once on a running host."""
    if mode not in SUDO_MODES:
        raise LabError(f"unknown sudo mode {mode!r} (one of {', '.join(SUDO_MODES)})")
    if not paths.host_dir(name).exists():
        raise LabError(f"no lab host {name} in {paths.directory}")
    set_password(paths, name, LAB_PASSWORD if mode in (PASSWORD, NONE) else None)
    _write_sudo_rule(paths, name, mode)
