"""The proof by the real thing: one playbook (tests/fixtures/ansible_side_by_side/: files, templates,
a loop, handlers, a role, vault values in vars_files and a copy source, filters) run by
ansible-playbook (ansible-core pinned in test_inventory_ansible.py) on two fresh lab hosts and by
`fleetctl run` on two fresh lab hosts; each run twice. The hosts' resulting files (path, kind,
mode, size, sha256, link target) and the recap counts (ok/changed/failed/skipped/...) are equal.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import SCRATCH_LAB_BASE, SCRATCH_LAB_DIR, SCRATCH_LAB_HOSTS, LabHandle, lab_usable, private_lab
from test_inventory_ansible import VENV, _ansible_works, _install_ansible

pytestmark = pytest.mark.lab
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ansible_side_by_side"
PASSWORD = "side-by-side vault password"
TOKEN = "tok-9f8e7d6c5b4a"  # the value inside vars/secret.yml once decrypted
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)"
                   r"\s+rescued=(\d+)\s+ignored=(\d+)", re.M)
KEYS = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")
# Every file under the app's folder: relative path, kind, mode, size, link target; then content hashes.
STATE = ("cd /srv/app && find . -printf '%p %y %m %s %l\\n' | sort && "
         "find . -type f -print0 | sort -z | xargs -0 sha256sum")


@pytest.fixture(scope="module")
def ansible_bin() -> Path:
    if not _ansible_works(VENV):
        _install_ansible(VENV)
    return VENV / "bin"


@pytest.fixture
def book(tmp_path: Path, ansible_bin: Path) -> Path:
    """The fixture playbook with its secrets encrypted by the real ansible-vault."""
    folder = tmp_path / "book"
    shutil.copytree(FIXTURE, folder)
    (tmp_path / "vault-pass").write_text(PASSWORD + "\n")
    for name in ("vars/secret.yml", "files/secret.txt"):
        subprocess.run([str(ansible_bin / "ansible-vault"), "encrypt", "--vault-password-file",
                        str(tmp_path / "vault-pass"), str(folder / name)], check=True, capture_output=True,
                       env=_ansible_env(tmp_path), timeout=120)
        assert (folder / name).read_text().startswith("$ANSIBLE_VAULT;1.1;AES256")
    return folder


def _ansible_env(scratch: Path) -> dict[str, str]:
    env = {**os.environ, "HOME": str(scratch), "ANSIBLE_LOCAL_TEMP": str(scratch / "ansible-tmp"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "False", "ANSIBLE_FORCE_COLOR": "0"}
    env.pop("ANSIBLE_CONFIG", None)
    # ssh's ControlPath is a Unix socket (108 bytes at most): under pytest-xdist the scratch path is too
    # long for it, so the sockets go to a short folder of their own.
    control = Path(tempfile.gettempdir()) / f"fleetctl-ans-cp-{os.getpid()}"
    control.mkdir(mode=0o700, exist_ok=True)
    env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(control)
    return env


def _host_state(lab: LabHandle) -> dict[str, str]:
    return {h: lab.ssh(h, STATE).stdout for h in lab.hosts}


def _fresh_lab(work: Callable[[LabHandle], list[dict[str, dict[str, int]]]]) -> tuple[list[dict[str, dict[str, int]]],
                                                                                     dict[str, str]]:
    """``work`` on a freshly made 2-host scratch lab; (its recaps, the hosts' files), then the lab purged."""
    with private_lab(SCRATCH_LAB_DIR, SCRATCH_LAB_HOSTS, SCRATCH_LAB_BASE) as lab:
        recaps = work(lab)
        return recaps, _host_state(lab)


@pytest.mark.timeout(900)  # two fresh labs and four runs: about 4 min on 2 busy cores
def test_same_playbook_same_end_state_as_ansible_playbook(book: Path, tmp_path: Path, ansible_bin: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    why = lab_usable()
    if why:
        pytest.skip(why)
    password = tmp_path / "vault-pass"
    seconds: list[tuple[str, float]] = []  # printed (-s) for the record, never asserted

    def with_ansible(lab: LabHandle) -> list[dict[str, dict[str, int]]]:
        known = f"-o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes " \
                "-o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes"
        recaps = []
        for _ in range(2):
            started = time.monotonic()
            done = subprocess.run([str(ansible_bin / "ansible-playbook"), "-i", str(lab.inventory_path),
                                   "--vault-password-file", str(password), "--ssh-common-args", known,
                                   str(book / "site.yml")], capture_output=True, text=True, cwd=lab.dir,
                                  env=_ansible_env(tmp_path), timeout=300)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
            seconds.append(("ansible-playbook", time.monotonic() - started))
            recaps.append({m[0]: dict(zip(KEYS, map(int, m[1:]), strict=True)) for m in RECAP.findall(done.stdout)})
        return recaps

    def with_fleetctl(lab: LabHandle) -> list[dict[str, dict[str, int]]]:
        recaps = []
        for _ in range(2):
            started = time.monotonic()
            r = run_cli(capsys, "-i", str(lab.inventory_path), "--vault-password-file", str(password), "run",
                        str(book / "site.yml"), "--json")
            assert r.rc == 0, r.out[-3000:] + r.err
            seconds.append(("fleetctl run", time.monotonic() - started))
            assert TOKEN not in r.out and TOKEN not in Path(r.json()["journal"]).read_text()
            recaps.append({h: {k: c[k] for k in KEYS} for h, c in r.json()["recap"].items()})
        return recaps

    ansible_recaps, ansible_files = _fresh_lab(with_ansible)
    fleet_recaps, fleet_files = _fresh_lab(with_fleetctl)
    print("side by side:", ", ".join(f"{tool} {s:.1f}s" for tool, s in seconds), json.dumps(fleet_recaps))
    # What Ansible made, for the record: a lab2-only file, both handlers once, the vault's values
    assert "./lab2-only" in ansible_files["lab2"] and "./lab2-only" not in ansible_files["lab1"]
    for host in ("lab1", "lab2"):
        for made in ("./token f 600", "./secret.txt f 600", "./restarts f", "./reloads f", "./logs d 755",
                     "./app.conf f 640", "./port-8002.conf f 644", ". d 750"):
            assert made in ansible_files[host], (host, made, ansible_files[host])
    assert ansible_recaps[0]["lab1"]["changed"] > 0 and ansible_recaps[1]["lab1"]["changed"] == 0
    assert fleet_files == ansible_files
    assert fleet_recaps == ansible_recaps, json.dumps({"ansible": ansible_recaps, "fleetctl": fleet_recaps})


LINTED = Path(__file__).resolve().parent / "fixtures" / "ansible_side_by_side_linted"
HF_TOKEN = "hf-env-token-5e4d"  # lookup('env', 'FLEETCTL_SBS_HF_TOKEN') in group_vars


def _linted_group_vars(lab: LabHandle, weights: Path) -> None:
    """group_vars/lab.yml beside the lab's inventory, as a linted repo keeps them: values that are
    templates (one naming another, one a lookup), read by both tools from the same file."""
    folder = lab.inventory_path.parent / "group_vars"
    folder.mkdir(exist_ok=True)
    (folder / "lab.yml").write_text(
        "app_root: /srv/app\n"
        "models_root: \"{{ app_root }}/models\"\n"
        "model_path: \"{{ models_root }}/qwen\"\n"
        "hf_token: \"{{ lookup('env', 'FLEETCTL_SBS_HF_TOKEN') }}\"\n"
        f"weights_url: \"file://{weights}\"\n"
        f"weights_sha256: {hashlib.sha256(weights.read_bytes()).hexdigest()}\n")


@pytest.mark.timeout(900)  # two fresh labs and four runs
def test_linted_role_layout_same_end_state_as_ansible_playbook(tmp_path: Path, ansible_bin: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """FQCNs, templated group_vars (one referencing another, one lookup('env')), stat, get_url with a
    sha256 checksum (a file:// URL the lab hosts read), play/role tags with --skip-tags and a `never`
    task, per-task check_mode: the same files and recaps from both tools, each run twice."""
    why = lab_usable()
    if why:
        pytest.skip(why)
    book = tmp_path / "linted"
    shutil.copytree(LINTED, book)
    weights = tmp_path / "weights.bin"
    weights.write_bytes(bytes(range(256)) * 32)
    weights.chmod(0o644)
    monkeypatch.setenv("FLEETCTL_SBS_HF_TOKEN", HF_TOKEN)
    args = ["--skip-tags", "slow"]

    def with_ansible(lab: LabHandle) -> list[dict[str, dict[str, int]]]:
        _linted_group_vars(lab, weights)
        known = f"-o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes " \
                "-o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes"
        recaps = []
        for _ in range(2):
            done = subprocess.run([str(ansible_bin / "ansible-playbook"), "-i", str(lab.inventory_path),
                                   "--ssh-common-args", known, *args, str(book / "site.yml")], capture_output=True,
                                  text=True, cwd=lab.dir, env=_ansible_env(tmp_path), timeout=300)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
            recaps.append({m[0]: dict(zip(KEYS, map(int, m[1:]), strict=True)) for m in RECAP.findall(done.stdout)})
        return recaps

    def with_fleetctl(lab: LabHandle) -> list[dict[str, dict[str, int]]]:
        _linted_group_vars(lab, weights)
        recaps = []
        for _ in range(2):
            r = run_cli(capsys, "-i", str(lab.inventory_path), "run", str(book / "site.yml"), *args, "--json")
            assert r.rc == 0, r.out[-3000:] + r.err
            recaps.append({h: {k: c[k] for k in KEYS} for h, c in r.json()["recap"].items()})
        return recaps

    ansible_recaps, ansible_files = _fresh_lab(with_ansible)
    fleet_recaps, fleet_files = _fresh_lab(with_fleetctl)
    for host in ("lab1", "lab2"):  # what Ansible made, for the record
        for made in (". d 750", "./models/qwen d 750", "./models/qwen/weights.bin f 640 8192", "./service.env f 600",
                     "./real f 644", "./stat.txt f 644", "./fetches f", "./stores f"):
            assert made in ansible_files[host], (host, made, ansible_files[host])
        for absent in ("./debug-only", "./skipped-by-tag", "./dry-run-only"):
            assert absent not in ansible_files[host], (host, absent)
    assert hashlib.sha256(f"HF_TOKEN={HF_TOKEN}\nMODEL=/srv/app/models/qwen\n".encode()).hexdigest() in \
        ansible_files["lab1"]
    assert ansible_recaps[1]["lab1"]["changed"] == 1  # the check_mode: true copy still "would change"
    assert fleet_files == ansible_files
    assert fleet_recaps == ansible_recaps, json.dumps({"ansible": ansible_recaps, "fleetctl": fleet_recaps})
