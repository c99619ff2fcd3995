"""Secrets planted everywhere a real run carries them never reach any output of fleetctl.

The planted secrets: a vault-encrypted value used as a host variable (templated into a release's
env and args), the become password (vault-encrypted too; fleetop's sudo on lab1 asks for it), the
passphrase of the encrypted key fleetop logs in with, and an ``-e`` value named in ``secret_vars``
that the sick release passes as an argument its server rejects, so the server prints it and the
failed gate's log tail carries it. The story, every command a real process: deploy, a second deploy
under ``-vv``, the sick deploy (gate fails, rolled back) with ``--json`` and ``-vv``, ``rollback``,
``status``, ``logs``, a playbook with ``--events`` and with ``--json -vv``, ``report`` (HTML and
``--json``), ``hosts``, and ``status`` over a kept connection. Then every output is searched for
each secret: stdout, stderr, the run journals, the crash-log folder, the connection server's log,
the HTML page and the host's own state file. A become password is on no command line: the host's
processes are read while a become command runs.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from lab_support import LabHandle, sudo_mode, user_inventory
from reliability_support import TINY_BASE, tiny_releases, write_spec
from service_cleanup import clean_releases

from fleetctl.lab.accounts import LAB_PASSWORD
from fleetctl.secrets import MASK
from fleetctl.transport import mux
from fleetctl.vault import encrypt

pytestmark = pytest.mark.lab
HOST = "lab1"
VAULT_PASSWORD = "vault-pw-for-the-redaction-test"
API_TOKEN = "tok-API-7f3a9c1e5b"  # vault-encrypted, the release's env and args
LOG_TOKEN = "tok-LOG-2d8e4f6a0c"  # -e, in secret_vars; the sick server prints it as it exits
PASSPHRASE = "key passphrase 5e1b"  # the login key's
SECRETS = {"api token (vault)": API_TOKEN, "-e log token": LOG_TOKEN, "become password (vault)": LAB_PASSWORD,
           "key passphrase": PASSPHRASE}
GOOD = textwrap.dedent("""\
    service:
      standin: true
      args: [--api-key, "{{ api_token }}"]
      env: {API_TOKEN: "{{ api_token }}"}
    health: {timeout: 30, interval: 0.2}
    """)
SICK = textwrap.dedent("""\
    service:
      standin: true
      args: [--speculative-algorithm, "{{ log_token }}"]
    health: {timeout: 5, interval: 0.2}
    """)
BOOK = textwrap.dedent("""\
    - hosts: lab1
      become: true
      tasks:
        - name: say the token
          debug: {msg: "token is {{ api_token }}"}
        - name: echo the token
          shell: {cmd: "echo api={{ api_token }} log={{ log_token }}"}
    """)


def vaulted(text: str, placeholder: str, value: str) -> str:
    """``text`` with the variable whose value is ``placeholder`` made an inline ``!vault`` of ``value``."""
    line = re.search(rf"^( *)(\S+): '?{placeholder}'?$", text, re.M)
    assert line is not None, text
    pad = line.group(1) + "  "
    block = "".join(f"\n{pad}{row}" for row in encrypt(value.encode(), VAULT_PASSWORD.encode()).splitlines())
    return text.replace(line.group(0), f"{line.group(1)}{line.group(2)}: !vault |{block}")


@pytest.fixture
def planted(lab_fleet: LabHandle, tmp_path: Path) -> Iterator[Path]:
    """An inventory for fleetop on lab1 whose key is encrypted, with the vault values and secret_vars."""
    locked = tmp_path / "locked_ed25519"
    shutil.copyfile(lab_fleet.key_path, locked)
    locked.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", PASSPHRASE, "-f", str(locked)], check=True)
    (tmp_path / "inv").mkdir()
    inv = user_inventory(lab_fleet, tmp_path / "inv" / "inventory.yml")
    doc = yaml.safe_load(inv.read_text())
    doc["all"]["children"]["lab"]["hosts"][HOST].update({
        "ansible_ssh_private_key_file": str(locked), "ansible_ssh_private_key_passphrase": PASSPHRASE,
        "api_token": "@API@", "ansible_become_password": "@BECOME@", "secret_vars": ["log_token"],
        "log_token": "unset"})
    text = yaml.safe_dump(doc, sort_keys=False)
    inv.write_text(vaulted(vaulted(text, "@API@", API_TOKEN), "@BECOME@", LAB_PASSWORD))
    (tmp_path / "vault-pw").write_text(VAULT_PASSWORD + "\n")
    tiny_releases(lab_fleet, tmp_path, [])
    lab_fleet.ssh(HOST, clean_releases())
    try:
        with sudo_mode(lab_fleet, HOST, "password"):
            yield inv
    finally:
        lab_fleet.ssh(HOST, clean_releases(TINY_BASE))


class Story:
    """Every command of the story as a real process; what each wrote, kept."""

    def __init__(self, inv: Path, home: Path, mux_dir: Path) -> None:
        self.inv, self.home, self.mux_dir = inv, home, mux_dir
        self.outputs: list[tuple[str, str]] = []

    def __call__(self, *args: str, rc: int | None = 0) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "fleetctl.cli.main", "-i", str(self.inv), "--vault-password-file",
                str(self.inv.parent.parent / "vault-pw"), "-b", "--yes", *args]
        env = {**os.environ, "COLUMNS": "200", "FLEETCTL_LOG_DIR": str(self.home / "logs"),
               "HOME": str(self.home), "FLEETCTL_MUX_DIR": str(self.mux_dir)}
        env.pop("SSH_AUTH_SOCK", None)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env,
                              cwd=self.inv.parent)
        name = " ".join(args)
        self.outputs += [(f"stdout of `{name}`", proc.stdout), (f"stderr of `{name}`", proc.stderr)]
        assert rc is None or proc.returncode == rc, f"`{name}`: {proc.returncode}: {proc.stdout[-3000:]}{proc.stderr}"
        return proc


def leaks(outputs: list[tuple[str, str]]) -> list[str]:
    return [f"{label} in {where}" for where, text in outputs for label, value in SECRETS.items() if value in text]


def test_no_secret_reaches_any_output_of_a_whole_story(lab_fleet: LabHandle, planted: Path, tmp_path: Path) -> None:
    # the connection server's socket and log: a short folder (a unix socket's path has at most 107 bytes,
    # which tmp_path under xdist with this test's name overruns)
    mux_dir = Path(tempfile.mkdtemp(prefix="fx-mux-"))
    lab, story = lab_fleet, Story(planted, tmp_path / "home", mux_dir)
    (tmp_path / "home").mkdir()
    try:
        walk_the_story(lab, story, tmp_path, planted)
    finally:
        shutil.rmtree(mux_dir, ignore_errors=True)


def walk_the_story(lab: LabHandle, story: Story, tmp_path: Path, planted: Path) -> None:
    good, second = (write_spec(tmp_path, n, GOOD, base=TINY_BASE, sglang=False) for n in ("good", "second"))
    sick = write_spec(tmp_path, "sick", SICK, base=TINY_BASE, sglang=False)
    log_token = ("-e", f"log_token={LOG_TOKEN}")
    story("-l", HOST, *log_token, "deploy", str(good), "--json")
    story("-vv", "-l", HOST, "deploy", str(second))
    # the server got the token in its env and args: the secret really went through the release
    pid = lab.ssh(HOST, "head -1 /var/lib/fleetctl/service/sglang.pid").stdout.strip()
    assert f"API_TOKEN={API_TOKEN}" in lab.ssh(HOST, f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
    failed = story("-l", HOST, *log_token, "deploy", str(sick), "--json", rc=2)
    # the gate failed on the server's exit and its log tail is in the answer, masked
    assert f"invalid choice: '{MASK}'" in failed.stdout, failed.stdout[-3000:]
    story("-vv", "-l", HOST, *log_token, "deploy", str(sick), rc=2)
    assert lab.ssh(HOST, "grep -c -- " + LOG_TOKEN + " /var/lib/fleetctl/service/sglang.log; true").stdout.strip() \
        not in ("", "0"), "the sick server never printed the token: the log tail cannot carry it"
    story("-l", HOST, "rollback")
    story("-vv", "-l", HOST, "status", "--json")
    story("-l", HOST, *log_token, "logs", "-n", "200")
    book = tmp_path / "book.yml"
    book.write_text(BOOK)
    story(*log_token, "run", str(book), "--events")
    story("-vv", *log_token, "run", str(book), "--json")
    page = tmp_path / "page.html"
    story("-l", HOST, *log_token, "report", "--output", str(page), "--json", rc=None)
    story("-vv", *log_token, "hosts", "--json")
    try:  # kept connections: the connection server's own log is an output too
        story("--persist", "60", "-vv", "-l", HOST, "status", "--json")
    finally:
        mux.stop_server(mux.socket_path(story.mux_dir))

    files = [p for folder in (planted.parent / ".fleetctl", tmp_path / "home", story.mux_dir) if folder.exists()
             for p in sorted(folder.rglob("*")) if p.is_file()]  # journals; crash and server logs
    assert any(p.suffix == ".jsonl" for p in files), "no run journal was written: nothing searched there"
    outputs = [*story.outputs, *((str(p), p.read_text(errors="replace")) for p in files),
               ("report page", page.read_text())]
    outputs.append((f"{HOST}:/var/lib/fleetctl/state.json", lab.ssh(HOST, "cat /var/lib/fleetctl/state.json").stdout))
    found = leaks(outputs)
    assert not found, "\n".join(found)


# Run on the host under sudo: the command lines of the command's ancestors (its shell, sudo, the
# shell sshd started, sshd) and of every process of fleetop, base64 (no output masking applies).
CMDLINES = textwrap.dedent("""\
    import base64, json, os, pwd
    def read(pid, name):
        try:
            return open("/proc/%s/%s" % (pid, name), "rb").read().decode("utf-8", "replace")
        except OSError:
            return ""
    uid, pid, lines = pwd.getpwnam("fleetop").pw_uid, os.getpid(), []
    while pid > 1:
        lines.append(read(pid, "cmdline").replace("\\0", " "))
        pid = int(next(l.split()[1] for l in read(pid, "status").splitlines() if l.startswith("PPid:")))
    lines += [read(p, "cmdline").replace("\\0", " ") for p in os.listdir("/proc")
              if p.isdigit() and "Uid:\\t%d\\t" % uid in read(p, "status")]
    print(base64.b64encode(json.dumps(lines).encode()).decode())
    """)


def test_the_become_password_is_on_no_command_line(lab_fleet: LabHandle, planted: Path, tmp_path: Path) -> None:
    """While a become command runs, the command lines of its ancestors (sudo's among them) and of
    every process of the login user are read: sudo got the password on stdin, so none holds it."""
    story = Story(planted, tmp_path, tmp_path / "mux")
    proc = story("-l", HOST, "shell", "--json", f"/usr/bin/python3 -c {shlex.quote(CMDLINES)}")
    stdout = json.loads(proc.stdout)["hosts"][HOST]["value"]["stdout"]
    cmdlines = json.loads(base64.b64decode(stdout))
    assert any(line.startswith("sudo -H -S -p ") for line in cmdlines), cmdlines  # sudo's own line was read
    assert [line for line in cmdlines if LAB_PASSWORD in line] == []
