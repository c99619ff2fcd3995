"""Connections as OpenSSH would make them, on the lab: a test HOME whose ~/.ssh/config defines the
hosts (aliases with HostName, User, Port, IdentityFile, ProxyJump, through an Include), an
inventory naming only the aliases, bastion keys checked, ``hosts trust`` through a bastion, and
the other ways to log in (a password, an encrypted key, ssh-agent)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import CliRun, run_cli
from lab_support import LabHandle, password_login

from fleetctl.lab.accounts import LAB_PASSWORD

pytestmark = pytest.mark.lab
COMMENTS = ("# pinned by hand\n@cert-authority *.corp.example ssh-ed25519 "
            "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")


@pytest.fixture
def home(lab_fleet: LabHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME with ~/.ssh/config (and an Included file) for the lab's hosts; an inventory of aliases."""
    lab = lab_fleet
    home = tmp_path / "home"
    (home / ".ssh" / "hosts.d").mkdir(parents=True)
    key = home / ".ssh" / "lab_ed25519"
    shutil.copyfile(lab.key_path, key)
    key.chmod(0o600)
    a = lab.addresses
    (home / ".ssh" / "config").write_text(
        f"Include hosts.d/*.conf\n"
        f"Host gpu-a\n  HostName {a['lab1']}\n  User fleetop\n  Port 22\n  IdentityFile ~/.ssh/lab_ed25519\n"
        f"Host gpu-closed\n  HostName {a['lab1']}\n  Port 2299\n  IdentityFile ~/.ssh/lab_ed25519\n")
    (home / ".ssh" / "hosts.d" / "behind.conf").write_text(
        f"Host gpu-b\n  HostName {a['lab2']}\n  User fleetop\n  ProxyJump gpu-a\n  IdentityFile ~/.ssh/lab_ed25519\n"
        f"Host gpu-c\n  HostName {a['lab3']}\n  ProxyJump gpu-a,gpu-b\n  IdentityFile ~/.ssh/lab_ed25519\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("FLEETCTL_SSH_CONFIG", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "hosts.yml").write_text("all:\n  hosts:\n    gpu-a:\n    gpu-b:\n    gpu-c:\n")
    (tmp_path / "inv" / "known_hosts").write_text(lab.known_hosts.read_text())
    return tmp_path / "inv"


def cli(capsys: pytest.CaptureFixture[str], inv: Path, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(inv / "hosts.yml"), *args)


def test_aliases_decide_address_user_key_and_bastions(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(capsys, home, "-l", "all", "shell", "--json", "echo $(id -un)@$(hostname)")
    assert r.rc == 0, r.out + r.err
    got = {h: v["value"]["stdout"].strip() for h, v in r.json()["hosts"].items()}
    # gpu-c sets no User: the local user (root here), never a user fleetctl made up
    assert got == {"gpu-a": "fleetop@lab1", "gpu-b": "fleetop@lab2", "gpu-c": "root@lab3"}
    again = cli(capsys, home, "-u", "fleetop", "-l", "gpu-c", "shell", "--json", "id -un")
    assert again.json()["hosts"]["gpu-c"]["value"]["stdout"] == "fleetop\n"  # -u fills what ssh_config left


def test_port_from_ssh_config_is_used(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (home / "hosts.yml").write_text("all:\n  hosts:\n    gpu-closed:\n")
    r = cli(capsys, home, "ping", "--json")
    assert r.rc == 2
    assert ":2299" in r.json()["hosts"]["gpu-closed"]["reason"]


def test_a_changed_bastion_key_from_ssh_config_is_refused(lab_fleet: LabHandle, home: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    a = lab_fleet.addresses
    lines = (home / "known_hosts").read_text().splitlines()
    lab3_key = next(x.split(None, 1)[1] for x in lines if x.startswith(a["lab3"] + " "))
    (home / "known_hosts").write_text("".join(
        f"{a['lab1']} {lab3_key}\n" if x.startswith(a["lab1"] + " ") else x + "\n" for x in lines))
    r = cli(capsys, home, "-l", "gpu-b", "shell", "--json", "touch /tmp/ran-through-a-bad-bastion")
    assert r.rc == 2
    reason = r.json()["hosts"]["gpu-b"]["reason"]
    assert reason.startswith(f"HOST KEY CHANGED for {a['lab1']}"), reason
    assert lab_fleet.ssh("lab2", "ls /tmp/ran-through-a-bad-bastion", check=False).returncode != 0


def test_hosts_trust_through_a_bastion_and_an_alias_keeps_the_file(lab_fleet: LabHandle, home: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    a = lab_fleet.addresses
    (home / "known_hosts").write_text(COMMENTS)
    refused = cli(capsys, home, "-l", "gpu-c", "ping", "--json")
    assert refused.rc == 2 and "unknown host key" in refused.json()["hosts"]["gpu-c"]["reason"]
    r = cli(capsys, home, "-l", "gpu-c", "hosts", "trust", "--json")
    assert r.rc == 0, r.out + r.err
    entry = r.json()["hosts"]["gpu-c"]
    assert [b["name"] for b in entry["bastions"]] == [a["lab1"], a["lab2"]]  # first hop first
    assert entry["value"]["name"] == a["lab3"] and entry["value"]["state"] == "new"
    text = (home / "known_hosts").read_text()
    assert text.startswith(COMMENTS)  # appended to; the comment and the marker line kept
    pinned = {line.split()[0]: line.split(None, 1)[1].strip() for line in text.splitlines()[2:]}
    assert pinned == {a[h]: " ".join(lab_fleet.known_hosts.read_text().split(a[h] + " ", 1)[1].split()[:2])
                      for h in ("lab1", "lab2", "lab3")}
    ok = cli(capsys, home, "-l", "gpu-c", "shell", "--json", "hostname")
    assert ok.rc == 0 and ok.json()["hosts"]["gpu-c"]["value"]["stdout"] == "lab3\n"


def test_password_login_works_and_a_wrong_one_is_one_line(lab_fleet: LabHandle, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no default keys to fall back on
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    inv = tmp_path / "hosts.yml"
    (tmp_path / "known_hosts").write_text(lab_fleet.known_hosts.read_text())
    address = lab_fleet.addresses["lab2"]
    with password_login(lab_fleet, "lab2"):
        for password, rc in ((LAB_PASSWORD, 0), ("wrong-password", 2)):
            inv.write_text(f"all:\n  hosts:\n    lab2:\n      ansible_host: {address}\n      ansible_user: fleetop\n"
                           f"      ansible_password: {password}\n")
            r = run_cli(capsys, "-i", str(inv), "-l", "all", "shell", "--json", "id -un")
            assert r.rc == rc, r.out + r.err
            assert password not in r.out + r.err
            if rc == 0:
                assert r.json()["hosts"]["lab2"]["value"]["stdout"] == "fleetop\n"
            else:
                reason = r.json()["hosts"]["lab2"]["reason"]
                assert reason == (f"authentication failed for fleetop@{address}:22 (default keys, password): "
                                  "Authentication failed."), reason


@pytest.fixture
def agent_sock(tmp_path: Path) -> Iterator[str]:
    sock = str(tmp_path / "agent.sock")
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            subprocess.run(["sleep", "0.05"], check=False)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_encrypted_key_needs_its_passphrase_or_the_agent(lab_fleet: LabHandle, tmp_path: Path, agent_sock: str,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    locked = tmp_path / "locked_ed25519"
    shutil.copyfile(lab_fleet.key_path, locked)
    locked.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", "open sesame", "-f", str(locked)], check=True)
    (tmp_path / "known_hosts").write_text(lab_fleet.known_hosts.read_text())
    inv = tmp_path / "hosts.yml"
    host = (f"all:\n  hosts:\n    lab1:\n      ansible_host: {lab_fleet.addresses['lab1']}\n"
            "      ansible_user: fleetop\n")
    inv.write_text(host + f"      ansible_ssh_private_key_file: {locked}\n")
    r = run_cli(capsys, "-i", str(inv), "ping", "--json")
    assert r.rc == 2 and r.json()["hosts"]["lab1"]["reason"].endswith(
        "is encrypted: add it to ssh-agent or set ansible_ssh_private_key_passphrase (a secret)"), r.out
    inv.write_text(host + f"      ansible_ssh_private_key_file: {locked}\n"
                          "      ansible_ssh_private_key_passphrase: open sesame\n")
    r = run_cli(capsys, "-i", str(inv), "ping", "--json")
    assert r.rc == 0, r.out + r.err
    assert "open sesame" not in run_cli(capsys, "-i", str(inv), "hosts", "--json").out  # masked as a secret
    # the agent holds the key: no key file named at all
    subprocess.run(["ssh-add", "-q", str(lab_fleet.key_path)], env={**os.environ, "SSH_AUTH_SOCK": agent_sock},
                   check=True, capture_output=True)
    monkeypatch.setenv("SSH_AUTH_SOCK", agent_sock)
    inv.write_text(host)
    r = run_cli(capsys, "-i", str(inv), "ping", "--json")
    assert r.rc == 0, r.out + r.err


# A one-distribution venv (made by hand: no pip needed) for the overlay through bastions below.
TINY_DIST = r"""
import base64, hashlib, os, sys
site, value = sys.argv[1], sys.argv[2]
files = {"demo_cfg/__init__.py": "VALUE = %r\n" % value,
         "demo_cfg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: demo-cfg\nVersion: 1.0\n",
         "demo_cfg-1.0.dist-info/INSTALLER": "pip\n"}
lines = []
for rel, text in files.items():
    os.makedirs(os.path.dirname(os.path.join(site, rel)), exist_ok=True)
    data = text.encode()
    open(os.path.join(site, rel), "wb").write(data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    lines.append("%s,sha256=%s,%d" % (rel, digest, len(data)))
lines.append("demo_cfg-1.0.dist-info/RECORD,,")
open(os.path.join(site, "demo_cfg-1.0.dist-info/RECORD"), "w").write("\n".join(lines) + "\n")
"""


@pytest.mark.parametrize("bulk", ["openssh", "paramiko"])
def test_overlay_through_bastions_and_sudo_streams_over_the_checked_hops(
        lab_fleet: LabHandle, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        bulk: str) -> None:
    """The overlay's file stream goes through an OpenSSH client (or paramiko, forced) on the same
    hops as every other connection: gpu-b one bastion away as fleetop with sudo, gpu-c two away."""
    import fleetctl.overlay.stream as overlay

    lab, env = lab_fleet, "/opt/cfg-env"
    site = f"{env}/lib/python3.11/site-packages"
    for host in ("lab1", "lab2", "lab3"):
        lab.ssh(host, f"rm -rf {env} && /usr/bin/python3 -m venv --without-pip {env}")
    lab.ssh("lab1", f"/usr/bin/python3 - {site} 'from gpu-a' <<'EOF'\n{TINY_DIST}\nEOF")
    used: list[str] = []

    def spied(connector: object, command: str) -> object:
        stream = real(connector, command)
        used.append(type(stream).__name__)
        return stream

    real = overlay.bulk_stream
    monkeypatch.setattr(overlay, "bulk_stream", spied)
    monkeypatch.setenv("FLEETCTL_BULK_SSH", bulk)
    r = cli(capsys, home, "-b", "-l", "gpu-a,gpu-b,gpu-c", "venv", "overlay", "--from", "gpu-a", "--venv", env,
            "--json")
    assert r.rc == 0, r.out + r.err
    # one stream from the source, one into each target
    assert used == ["OpenSSHStream" if bulk == "openssh" else "ChannelStream"] * 3, used
    for host in ("lab2", "lab3"):
        got = lab.ssh(host, f"cat {site}/demo_cfg/__init__.py && stat -c %U {site}/demo_cfg/__init__.py").stdout
        assert got == "VALUE = 'from gpu-a'\nroot\n", host  # written by the become user (root)
    again = cli(capsys, home, "-b", "-l", "gpu-a,gpu-b,gpu-c", "drift", "--baseline", "gpu-a", "--venv", env,
                "--verify-files", "--json")
    assert again.rc == 0, again.out + again.err
    for host in ("lab1", "lab2", "lab3"):
        lab.ssh(host, f"rm -rf {env}")
