"""Real SGLang wheels from PyPI, cached, installed with --no-deps into lab hosts' venvs.

The lab hosts run real venvs holding the real sglang source trees, so probes and drift audits
are tested against the files users actually have. Wheels are downloaded once into
``.cache/wheels`` (gitignored) and copied into the lab folder, which every lab host can see.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lab_support import REPO, LabHandle

WHEEL_CACHE = REPO / ".cache" / "wheels"
NEW_SGLANG = "0.5.23"  # has SpeculativeAlgorithm.DFLASH
OLD_SGLANG = "0.5.9"  # does not
ML_VENV = "/root/ml-env"
# lab1 and lab3 run the new release, lab2 the old one.
LAYOUT = {"lab1": NEW_SGLANG, "lab2": OLD_SGLANG, "lab3": NEW_SGLANG}


def wheel(project: str, version: str) -> Path:
    """The cached wheel of project==version, downloaded from PyPI on first use."""
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    pattern = f"{project.replace('-', '_')}-{version}-*.whl"
    found = sorted(WHEEL_CACHE.glob(pattern))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", str(WHEEL_CACHE), f"{project}=={version}"], check=True)
        found = sorted(WHEEL_CACHE.glob(pattern))
    assert found, f"pip downloaded no wheel for {project}=={version}"
    return found[0]


def visible_wheel(lab: LabHandle, path: Path) -> str:
    """A copy of ``path`` in the lab folder, where every lab host can read it."""
    target = lab.dir / "wheels" / path.name
    if not target.exists() or target.stat().st_size != path.stat().st_size:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return str(target)


def make_venv(lab: LabHandle, host: str, venv: str, wheels: list[Path], fresh: bool = False) -> None:
    """A real venv on ``host`` with exactly ``wheels`` installed by pip (--no-deps); reused when
    an earlier run left the same set (the marker file), unless ``fresh``."""
    names = "\n".join(sorted(w.name for w in wheels))
    marker = f"{venv}/.fleetctl-test-wheels"
    if not fresh:
        have = lab.ssh(host, f"cat {shlex.quote(marker)} 2>/dev/null", check=False).stdout.strip()
        if have == names:
            return
    paths = " ".join(shlex.quote(visible_wheel(lab, w)) for w in wheels)
    q = shlex.quote(venv)
    script = (
        f"set -e; rm -rf {q}; /usr/bin/python3 -m venv {q}; "
        f"{q}/bin/python -m pip install -q --no-deps --no-index --no-compile --disable-pip-version-check {paths}; "
        f"printf '%s\\n' {shlex.quote(names)} > {shlex.quote(marker)}"
    )
    proc = lab.ssh(host, script, check=False)
    assert proc.returncode == 0, f"{host}: venv setup failed: {proc.stderr[-2000:]}"


def install_layout(lab: LabHandle, layout: dict[str, str], venv: str = ML_VENV) -> None:
    """Each host gets a venv with its sglang version, in parallel."""
    wheels = {v: wheel("sglang", v) for v in set(layout.values())}
    with ThreadPoolExecutor(max_workers=len(layout)) as pool:
        list(pool.map(lambda h: make_venv(lab, h, venv, [wheels[layout[h]]]), sorted(layout)))


def wheel_set(requirement: str) -> list[Path]:
    """A requirement and all its dependencies as wheels (a consistent set: pip check is clean)."""
    folder = WHEEL_CACHE / "sets" / requirement.replace("=", "-").replace(" ", "")
    if not (folder / ".complete").exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                        "--python-version", "3.11", "-d", str(folder), requirement], check=True)
        (folder / ".complete").touch()
    return sorted(folder.glob("*.whl"))


def generate(port: int, tokens: int, path: str = "/generate", host: str = "127.0.0.1") -> dict[str, Any]:
    """One generation from a (stand-in) server, as a client would send it."""
    body = {"text": "hi", "sampling_params": {"max_new_tokens": tokens}} if path == "/generate" else \
        {"model": "m", "prompt": "hi", "max_tokens": tokens}
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as answer:
        return dict(json.loads(answer.read()))
