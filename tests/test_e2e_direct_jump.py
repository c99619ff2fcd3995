"""``venv overlay --direct`` through a jump host: the target's ssh checks the bastion's key by
fleetctl's rules (StrictHostKeyChecking=yes, per hop, against the target's known_hosts as for the
source), even where the target's own ssh_config says ``StrictHostKeyChecking no``: a wrong key and
an unpinned one are both refused in one line. lab2 pulls from lab1 through lab3."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from cli_support import run_cli
from lab_support import LabHandle
from sglang_support import make_venv, wheel_set

pytestmark = pytest.mark.lab
SRC, DST = "/root/ov-jump-src", "/root/ov-jump-dst"


def pinned(lab: LabHandle, host: str) -> str:
    """lab's pinned known_hosts line for ``host``, as that host's key."""
    address = lab.addresses[host]
    return next(line for line in lab.known_hosts.read_text().splitlines()
                if address in line.split(" ", 1)[0].replace("[", "").replace("]", "").split(","))


def test_a_bastion_with_a_wrong_key_is_refused_on_the_direct_path(lab_fleet: LabHandle, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    lab = lab_fleet
    make_venv(lab, "lab1", SRC, wheel_set("requests==2.32.3"))
    lab.ssh("lab2", f"rm -rf {DST} && /usr/bin/python3 -m venv {DST}")
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["all"]["children"]["lab"]["hosts"]["lab1"]["jump_host"] = "lab3"  # lab3's inventory entry
    inventory = lab.dir / f"inventory-direct-jump-{tmp_path.name}.yml"
    inventory.write_text(yaml.safe_dump(doc))
    ssh_dir = lab.dir / "hosts" / "lab2" / "root" / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    key, known, config = ssh_dir / "id_ed25519", ssh_dir / "known_hosts", ssh_dir / "config"
    # lab3's name resolves on lab2 too (its own /etc/hosts), so a hop given by name reaches it
    etc_hosts = lab.dir / "hosts" / "lab2" / "etc" / "hosts"
    hosts_before = etc_hosts.read_text()
    etc_hosts.write_text(hosts_before + f"{lab.addresses['lab3']} lab3\n")
    key.write_bytes(lab.key_path.read_bytes())
    key.chmod(0o600)
    config.write_text("Host *\n    StrictHostKeyChecking no\n")  # a lax ssh_config on the target
    lab1_line, lab3_line = pinned(lab, "lab1"), pinned(lab, "lab3")
    wrong = "lab3," + lab3_line.split(" ", 1)[0] + " " + lab1_line.split(" ", 1)[1]  # lab3, with lab1's key
    args = ("-i", str(inventory), "-l", "lab2", "venv", "overlay", "--from", "lab1", "--venv", SRC,
            "--to-venv", DST, "--direct", "--packages", "idna", "--json")
    try:
        known.write_text(f"{lab1_line}\n{wrong}\n")
        before = lab.ssh("lab2", f"find {shlex.quote(DST)} | sort | md5sum").stdout
        refused = run_cli(capsys, *args)
        assert refused.rc == 2, refused.out[-2000:] + refused.err
        after = lab.ssh("lab2", f"find {shlex.quote(DST)} | sort | md5sum").stdout
        known.write_text(f"{lab1_line}\n")  # the bastion's key not pinned at all: no trust on first use
        unknown = run_cli(capsys, *args)
        assert unknown.rc == 2, unknown.out[-2000:] + unknown.err
        assert known.read_text() == f"{lab1_line}\n"
        known.write_text(f"{lab1_line}\nlab3,{lab3_line}\n")  # the control: the right bastion key
        passed = run_cli(capsys, *args)
    finally:
        for path in (key, known, config):
            path.unlink(missing_ok=True)
        etc_hosts.write_text(hosts_before)
        inventory.unlink()
    reason = refused.json()["hosts"]["lab2"]["reason"]
    assert reason.startswith("lab2 cannot reach lab1 directly: Host key verification failed"), reason
    assert after == before  # nothing landed
    assert unknown.json()["hosts"]["lab2"]["reason"].startswith(
        "lab2 cannot reach lab1 directly: Host key verification failed")
    assert passed.rc == 0, passed.out[-2000:] + passed.err
    assert passed.json()["hosts"]["lab2"]["value"]["applied"]["via"] == "direct"
