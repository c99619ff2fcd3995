"""fleetctl as a user installs it: a wheel built from this checkout, installed into a fresh venv outside
the checkout, deploys a release to a lab host and writes the report page (issue 31, item 1).

The wheel is built without build isolation (no download: setuptools comes from `make deps`). The new
venv gets only the wheel; its dependencies (click, fabric, jinja2, ...) are made visible by a .pth line
naming this checkout's venv site-packages, which holds fleetctl only as an editable finder that a
plain .pth path line never runs, so every fleetctl module and data file comes from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import CLEAN_RELEASES
from lab_support import REPO, LabHandle

pytestmark = pytest.mark.lab
BASE_VENV = "/root/wheel-test-env"  # the release adopts it: an empty venv is enough for the stand-in
SPEC = f"""\
name: wheel-smoke
version: "1"
description: the stand-in, deployed by fleetctl installed from its wheel
base: {{adopt: {BASE_VENV}}}
service:
  standin: true
  args: [--model-path, /models/tiny]
  port: 30000
health: {{timeout: 60, interval: 0.2}}
"""


def source_files() -> set[str]:
    """Every file of the package in the checkout (bytecode aside): the wheel must hold all of them."""
    root = REPO / "fleetctl"
    return {p.relative_to(REPO).as_posix() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def build_wheel(tmp: Path) -> Path:
    """`pip wheel` of a copy of the checkout's package sources (the build leaves nothing in the checkout)."""
    src = tmp / "src"
    shutil.copytree(REPO / "fleetctl", src / "fleetctl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(REPO / "pyproject.toml", src / "pyproject.toml")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp / "dist").glob("fleetctl-*.whl")
    return wheel


def install_wheel(tmp: Path, wheel: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--no-index", str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "fleetctl-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def installed(venv: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, run from outside the checkout with no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / "fleetctl"), *args], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_wheel_install_deploys_and_reports(lab_fleet: LabHandle, tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    held = set(zipfile.ZipFile(wheel).namelist())
    assert sorted(source_files() - held) == []  # templates, css, host-side scripts: all of it ships

    venv = install_wheel(tmp_path, wheel)
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import fleetctl; print(fleetctl.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(REPO), where

    spec = tmp_path / "wheel-smoke.yml"
    spec.write_text(SPEC)
    inv = str(lab_fleet.inventory_path)
    lab_fleet.ssh("lab1", CLEAN_RELEASES)
    lab_fleet.ssh("lab1", f"rm -rf {BASE_VENV} && /usr/bin/python3 -m venv --without-pip {BASE_VENV}")
    try:
        dep = installed(venv, tmp_path, "-i", inv, "-l", "lab1", "deploy", str(spec), "--json")
        assert dep.returncode == 0, dep.stdout + dep.stderr
        lab1 = json.loads(dep.stdout)["hosts"]["lab1"]
        assert (lab1["status"], lab1["value"]["outcome"]) == ("ok", "deployed")
        release = lab1["value"]["release_id"]
        stored = lab_fleet.ssh("lab1", "cat /opt/fleetctl/current/service.json").stdout
        assert f"(fleetctl release {release})" in json.loads(stored)["unit"]  # the packaged unit template

        page = tmp_path / "report.html"
        rep = installed(venv, tmp_path, "-i", inv, "-l", "lab1", "report", "--output", str(page))
        assert rep.returncode in (0, 1), rep.stdout + rep.stderr  # 1: some host red (no GPU here)
        html = page.read_text()
        assert release in html
        css = (REPO / "fleetctl" / "pages" / "templates" / "report.css").read_text()
        assert css.strip().splitlines()[0] in html  # the packaged stylesheet, inlined
    finally:
        lab_fleet.ssh("lab1", CLEAN_RELEASES)
        lab_fleet.ssh("lab1", f"rm -rf {BASE_VENV}")
