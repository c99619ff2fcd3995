"""The lab's stand-in SGLang server (``service.standin``) deploys only to lab hosts: a host without
the lab's marker (/etc/fleetctl-lab/lab-host, written by `fleetctl lab` on its hosts) refuses it
before building anything, in one line, and keeps serving what it served."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle
from reliability_support import tiny_releases

pytestmark = pytest.mark.lab
MARKER = "/etc/fleetctl-lab/lab-host"


def test_standin_is_refused_on_a_host_that_is_not_a_lab_host(release_free_lab: LabHandle, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    lab = release_free_lab
    inv = str(lab.inventory_path)
    first, second = tiny_releases(lab, tmp_path, ["standin-one", "standin-two"])
    deployed = run_cli(capsys, "-i", inv, "-l", "lab3", "deploy", str(first))
    assert deployed.rc == 0, deployed.out + deployed.err  # a lab host takes it (the control)
    before = lab.ssh("lab3", "readlink /opt/fleetctl/current").stdout
    lab.ssh("lab3", f"mv {MARKER} {MARKER}.away")
    try:
        refused = run_cli(capsys, "-i", inv, "-l", "lab3", "deploy", str(second))
    finally:
        lab.ssh("lab3", f"mv {MARKER}.away {MARKER}")
    assert refused.rc == 2, refused.out + refused.err
    lines = [line for line in (refused.out + refused.err).splitlines() if "not a lab host" in line]
    assert len(lines) == 1 and "service.standin is for fleetctl's lab only" in lines[0], refused.out + refused.err
    assert lab.ssh("lab3", "readlink /opt/fleetctl/current").stdout == before
    assert lab.ssh("lab3", "ls /opt/fleetctl/releases").stdout.split() == [Path(before.strip()).name]
