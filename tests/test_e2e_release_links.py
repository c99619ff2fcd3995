"""A release build on a lab host (real sshd; /opt and /srv are separate bind mounts there): hard
links where the base venv and the releases share a mount, a copy that says why where they do not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from lab_support import LabHandle

from fleetctl.inventory import load_inventory
from fleetctl.transport.fleet import Fleet

pytestmark = pytest.mark.lab
ROOT, STATE = "/opt/fleetctl-links", "/var/lib/fleetctl-links"
SAME_MOUNT, OTHER_MOUNT = "/opt/links-venv", "/srv/links-venv"  # the releases live under /opt
SITE = "lib/python3.11/site-packages"


@pytest.fixture
def venvs(lab_fleet: LabHandle) -> Iterator[LabHandle]:
    for venv in (SAME_MOUNT, OTHER_MOUNT):
        pkg = f"{venv}/{SITE}/pkg"
        lab_fleet.ssh("lab1", f"python3 -m venv --without-pip {venv} && mkdir -p {pkg} && "
                              f"echo 'VALUE = 1' > {pkg}/mod.py && echo 'X = 1' > {pkg}/same.py")
    yield lab_fleet
    lab_fleet.ssh("lab1", f"rm -rf {SAME_MOUNT} {OTHER_MOUNT} {ROOT} {STATE}", check=False)


def _build(lab: LabHandle, base: str, rid: str) -> dict[str, Any]:
    inv = load_inventory(lab.inventory_path)
    with Fleet(inv, inv.select("lab1")) as fleet:
        out = fleet.map(lambda ctx: ctx.call("release_host", {
            "op": "build", "root": ROOT, "state_dir": STATE, "release_id": rid, "base_venv": base,
            "site": f"{base}/{SITE}", "files": {"pkg/mod.py": "VALUE = 2\n"}, "env_file": "",
            "manifest": {"release_id": rid, "spec_digest": rid}}))["lab1"]
    assert out.ok, out.reason
    return dict(out.value or {})


def _inode(lab: LabHandle, path: str) -> int:
    return int(lab.ssh("lab1", f"stat -c %i {path}").stdout)


def test_one_mount_links_and_another_mount_copies_and_says_why(venvs: LabHandle) -> None:
    linked = _build(venvs, SAME_MOUNT, "same")
    assert linked["copied"] == 0 and linked["linked"] > 0 and linked["clone"] == f"linked {linked['linked']} files"
    release = f"{ROOT}/releases/same/venv/{SITE}/pkg"
    assert _inode(venvs, f"{release}/same.py") == _inode(venvs, f"{SAME_MOUNT}/{SITE}/pkg/same.py")
    assert _inode(venvs, f"{release}/mod.py") != _inode(venvs, f"{SAME_MOUNT}/{SITE}/pkg/mod.py")  # patched
    assert venvs.ssh("lab1", f"cat {SAME_MOUNT}/{SITE}/pkg/mod.py").stdout == "VALUE = 1\n"  # the base untouched
    copied = _build(venvs, OTHER_MOUNT, "other")
    assert copied["linked"] == 0 and copied["copied"] == linked["linked"]
    assert copied["clone"] == (f"copied (cannot link across filesystems: {OTHER_MOUNT} and "
                               f"{ROOT}/releases/other/venv)")
    same = venvs.ssh("lab1", f"cd {ROOT}/releases/same/venv/{SITE} && sha256sum pkg/*.py").stdout
    assert venvs.ssh("lab1", f"cd {ROOT}/releases/other/venv/{SITE} && sha256sum pkg/*.py").stdout == same
