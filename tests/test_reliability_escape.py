"""Paths that escape their folder are refused: patches (``..``, absolute, symlinks), overlay streams
(RECORD rows leaving the venv by name or through a symlink; tar member names on the target),
release files, and ``kernels collect`` (host file names, symlinks, the triton folder, the
controller's own destination)."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle

from fleetctl.errors import InputError
from fleetctl.kernels import Collected, plan_collect
from fleetctl.transport.agent import module_source

GOOD = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
              "num_stages": 3}}
H200 = "E=256,N=256,device_name=NVIDIA_H200.json"
EVIL = "/root/evil-src"
SITE = f"{EVIL}/lib/python3.11/site-packages"


def remote(module: str) -> dict:  # type: ignore[type-arg]
    """A host-side module run here, as the agent would run it."""
    ns: dict = {"__name__": f"fleetctl_remote_{module}"}  # type: ignore[type-arg]
    exec(compile(module_source(module)[0], module, "exec"), ns)
    return ns


@pytest.mark.lab
def test_overlay_record_rows_leaving_the_venv_refused_nothing_written(
        lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    lab = lab_fleet
    setup = textwrap.dedent(f"""\
        set -e
        rm -rf {EVIL} /srv/fleetctl-escape && /usr/bin/python3 -m venv --without-pip {EVIL}
        mkdir -p {SITE}/evil {SITE}/evil-1.0.dist-info
        echo 'x = 1' > {SITE}/evil.py
        ln -s /etc/hostname {SITE}/evil/leak.txt
        echo secret > /srv/fleetctl-escape
        printf 'Metadata-Version: 2.1\\nName: evil\\nVersion: 1.0\\n' > {SITE}/evil-1.0.dist-info/METADATA
        printf 'evil.py,,\\nevil/leak.txt,,\\n../../../../../srv/fleetctl-escape,,\\n/srv/fleetctl-abs,,\\n' \\
            > {SITE}/evil-1.0.dist-info/RECORD
        """)
    lab.ssh("lab1", setup)
    lab.ssh("lab2", f"rm -rf {EVIL} /srv/fleetctl-escape /srv/fleetctl-abs && "
                    f"/usr/bin/python3 -m venv --without-pip {EVIL}")
    try:
        r = run_cli(capsys, "-i", str(lab.inventory_path), "-l", "lab2", "venv", "overlay", "--from", "lab1",
                    "--venv", EVIL, "--packages", "evil", "--json")
        assert r.rc == 2
        reason = r.json()["hosts"]["lab2"]["reason"]
        assert reason.startswith("refused, nothing written: evil 1.0: its RECORD names 3 paths outside the venv (e.g. ")
        ls = lab.ssh("lab2", f"ls -A {SITE} /srv").stdout.split()
        assert not {"evil.py", "evil", "evil-1.0.dist-info", "fleetctl-escape", "fleetctl-abs"} & set(ls), ls
    finally:
        lab.ssh("lab1", f"rm -rf {EVIL} /srv/fleetctl-escape")
        lab.ssh("lab2", f"rm -rf {EVIL}")


def test_overlay_target_refuses_stream_members_leaving_the_venv() -> None:
    ns = remote("overlay_target")
    applier = ns["Applier"].__new__(ns["Applier"])
    applier.site, applier.prefix = "/x/venv/lib/python3.11/site-packages", "/x/venv"
    assert applier.path("pkg/mod.py") == "/x/venv/lib/python3.11/site-packages/pkg/mod.py"
    assert applier.path("../../../bin/tool") == "/x/venv/bin/tool"  # data/scripts inside the venv are fine
    for bad in ("../../../../etc/cron.d/x", "/etc/passwd", "pkg/../../../../../tmp/x"):
        with pytest.raises(ValueError, match="it would land outside /x/venv"):
            applier.path(bad)


def test_release_files_never_leave_the_release_folder() -> None:
    safe_join = remote("release_host")["safe_join"]
    assert safe_join("/opt/fleetctl/releases/r/venv/site", "sglang/x.py").endswith("/site/sglang/x.py")
    for bad in ("../../../../etc/x", "/etc/x", "a/../../b"):
        with pytest.raises(ValueError, match="leaves"):
            safe_join("/opt/fleetctl/releases/r/venv/site", bad)


def _collected(files: dict[str, str], triton: str = "3.4.0") -> Collected:
    return Collected("gpu1", "/tune", triton, "host var", ["NVIDIA H200"], "host var", True, files)


def test_kernels_collect_names_from_a_host_never_leave_the_destination(tmp_path: Path) -> None:
    text = json.dumps(GOOD)
    with pytest.raises(InputError, match=r"gpu1: triton version '3\.4/\.\./\.\./x' \(host var\) does not name"):
        plan_collect(_collected({H200: text}, "3.4/../../x"), tmp_path, False)
    for bad in ("E=256,N=256,device_name=../../../../x.json", "E=256,N=256,device_name=/etc/x.json"):
        with pytest.raises(InputError, match="gpu1:/tune/E=256,N=256,device_name=.*: refused: the name leaves"):
            plan_collect(_collected({bad: text}), tmp_path, False)
    # the controller's destination holding a symlink that leads out: refused, nothing written through it
    folder = tmp_path / "triton_3_4_0"
    folder.mkdir()
    outside = tmp_path / "outside.json"
    (folder / H200).symlink_to(outside)
    with pytest.raises(InputError, match="refused: the name leaves"):
        plan_collect(_collected({H200: text}), tmp_path, False)
    assert not outside.exists()


@pytest.mark.lab
def test_kernels_collect_refuses_symlinks_on_the_host(lab_fleet: LabHandle, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    lab, src = lab_fleet, "/root/tune-out"
    lab.ssh("lab1", f"rm -rf {src} && mkdir {src} && echo {shlex.quote(json.dumps(GOOD))} > {src}/{shlex.quote(H200)}"
                    f" && ln -s /etc/passwd {src}/'E=8,N=16,device_name=NVIDIA_H200.json'")
    try:
        r = run_cli(capsys, "-i", str(lab.inventory_path), "-e", "triton_version=3.4.0", "kernels", "collect",
                    "--from", "lab1", "--src", src, "--dest", str(tmp_path / "k"), "--json")
        assert r.rc == 0, r.err
        assert r.json()["skipped"] == ["E=8,N=16,device_name=NVIDIA_H200.json (a symlink: refused)"]
        assert sorted(p.name for p in (tmp_path / "k" / "triton_3_4_0").iterdir()) == [H200]
    finally:
        lab.ssh("lab1", f"rm -rf {src}")
