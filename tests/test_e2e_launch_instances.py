"""Each instance's own launch args judged by the installed SGLang's parser before anything switches
(issue 18), on a lab venv where ``sglang.srt.server_args`` really imports: an instance override
with a flag SGLang does not know is refused in ``deploy --check`` and in ``deploy``, SGLang's line
naming host, instance and flag; ``current`` unchanged, no release folder left.

The venv is the smallest closure that imports SGLang's parser (sglang --no-deps, torch with its
CUDA libraries, and what ``server_args`` imports), installed on lab1 from the machine's
hash-checked wheelhouse (``make wheels``), removed at the end (FLEETCTL_PARSE_VENV_KEEP=1 keeps it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import CliRun, run_cli
from lab_support import REPO, LabHandle

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
VENV = "/opt/sgl-parse"
LOCK = REPO / "playbooks/files/locks/sglang-0.5.23-full.lock"
WHEELS = os.environ.get("FLEETCTL_FULL_WHEELS", "/var/cache/fleetctl-wheels/sglang-0.5.23")
KEEP = bool(os.environ.get("FLEETCTL_PARSE_VENV_KEEP"))
# What `from sglang.srt.server_args import ServerArgs` needs in 0.5.23 (found by importing it).
PARSER_CLOSURE = (
    "sglang msgspec numpy orjson psutil pybase64 requests urllib3 idna certifi torch typing_extensions triton "
    "packaging pillow starlette anyio pydantic pydantic_core typing_inspection pyzmq tqdm ipython traitlets "
    "pygments aiohttp multidict attrs yarl propcache aiohappyeyeballs aiosignal frozenlist").split()
READY = f"{VENV}/.parser-imports"
CLEAN = ("for f in /var/lib/fleetctl/service/*.supervisor.pid /var/lib/fleetctl/service/*.pid; do "
         "[ -f $f ] && kill -9 $(head -1 $f) 2>/dev/null; done; "
         "rm -rf /opt/fleetctl /var/lib/fleetctl /etc/fleetctl/boot.d /root/bare-env; true")


@pytest.fixture(scope="module")
def parser_lab(lab_fleet: LabHandle) -> Iterator[LabHandle]:
    lab = lab_fleet
    if lab.ssh("lab1", f"test -e {READY}", check=False).returncode != 0:
        subprocess.run([sys.executable, str(REPO / "scripts/wheelhouse.py"), "fetch", str(LOCK), WHEELS], check=True)
        nvidia = lab.ssh("lab1", f"cd {WHEELS} && ls nvidia_*.whl | grep -v cutlass").stdout.split()
        wheels = " ".join([*PARSER_CLOSURE, *(f"{WHEELS}/{w}" for w in nvidia)])
        lab.ssh("lab1", f"rm -rf {VENV} && /usr/bin/python3 -m venv {VENV} && {VENV}/bin/pip install -q "
                        f"--no-index --no-deps --no-compile --find-links {WHEELS} {wheels} && "
                        f"{VENV}/bin/python -c 'from sglang.srt.server_args import ServerArgs' && touch {READY}",
                timeout=1500)
    lab.ssh("lab1", f"{CLEAN}; /usr/bin/python3 -m venv --without-pip /root/bare-env")
    yield lab
    lab.ssh("lab1", CLEAN + ("" if KEEP else f"; rm -rf {VENV}"))


def cli(capsys: pytest.CaptureFixture[str], lab: LabHandle, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(lab.inventory_path), "-l", "lab1", *args)


def pair(folder: Path, name: str, b_args: str) -> Path:
    spec = folder / f"{name}.yml"
    spec.write_text(f'name: {name}\nversion: "1"\nbase: {{adopt: {VENV}}}\n'
                    "service:\n  standin: true\n  args: [--model-path, /models/m, --tp, \"8\"]\n  instances:\n"
                    '    - {name: a, port: 30021, args: [--tp, "4"]}\n'
                    f"    - {{name: b, port: 30022, args: {b_args}}}\n"
                    "health: {timeout: 60, interval: 0.2}\n")
    return spec


@pytest.mark.timeout(1800)  # the first run installs the parser's closure (torch and its CUDA libraries)
def test_an_instance_override_sglang_rejects_is_refused_before_the_switch(
        parser_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = parser_lab
    bare = tmp_path / "bare.yml"
    bare.write_text('name: bare\nversion: "1"\nbase: {adopt: /root/bare-env}\nservice: {standin: true}\n'
                    "health: {timeout: 30, interval: 0.2}\n")
    assert cli(capsys, lab, "deploy", str(bare)).rc == 0
    current = load_spec(bare).release_id

    good = cli(capsys, lab, "deploy", str(pair(tmp_path, "good", '[--tp, "4", --enable-metrics]')), "--check",
               "--json")
    assert good.rc == 0, good.out + good.err
    assert good.json()["hosts"]["lab1"]["value"]["launch"]["detail"].startswith("accepted by sglang 0.5.23's parser")

    sick = pair(tmp_path, "sick", '[--tp, "4", --no-such-flag, "1"]')
    why = ("sglang 0.5.23 rejects the launch args of instance b: sglang serve: error: unrecognized arguments: "
           "--no-such-flag 1; nothing switched")
    for check in (("--check",), ()):
        r = cli(capsys, lab, "deploy", str(sick), *check, "--json")
        assert r.rc == 2, r.out + r.err
        assert r.json()["hosts"]["lab1"]["reason"] == why
        assert lab.ssh("lab1", "readlink /opt/fleetctl/current").stdout.strip() == f"releases/{current}"
        assert load_spec(sick).release_id not in lab.ssh("lab1", "ls /opt/fleetctl/releases").stdout.split()
    table = cli(capsys, lab, "deploy", str(sick))
    assert table.rc == 2 and f"lab1: failed: {why}" in " ".join((table.out + table.err).split())
