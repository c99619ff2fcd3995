"""Release pieces that need no host: the spec's errors, the service command, env file and unit."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from fleetctl.errors import InputError
from fleetctl.release.service import TEMPLATES, HostLayout, command, env_file, layout_for, systemd_quote, unit
from fleetctl.release.spec import load_spec

RELEASES = Path(__file__).resolve().parents[1] / "playbooks" / "releases"


def test_example_specs_load_with_stable_ids() -> None:
    for path in sorted(RELEASES.glob("*.yml")):
        spec = load_spec(path)
        assert spec.release_id.startswith(f"{spec.model.name}-{spec.model.version}-")
        assert load_spec(path).release_id == spec.release_id
    ddtree = load_spec(RELEASES / "ddtree-sglang-0.5.23.yml")
    assert [p.path.name for p in ddtree.patches] == [
        "0001-register-ddtree-algorithm.patch", "0002-server-args-ddtree.patch", "0003-ddtree-tree-builder.patch"]


@pytest.mark.parametrize(("body", "error"), [
    ("name: x\nversion: '1'\nbase: {adopt: /v}\nservcie: {}\n", ":4: servcie: unknown key"),
    ("name: x\nversion: '1'\n", ":1: base: required key missing"),
    ("name: x\nversion: '1'\nbase: {adopt: rel/path}\n", ":3: base: adopt must be an absolute path"),
    ("name: x\nversion: '1'\nbase: {adopt: /v}\nservice:\n  port: 99999\n",
     ":5: service.port: Input should be less than or equal to 65535"),
    ("name: x\nversion: '1'\nbase: {adopt: /v}\npatches:\n  - file: nope.patch\n    distribution: sglang\n"
     "    version: '0.5.23'\n", ":5: patches.0.file: no such file"),
    ("name: x\nversion: '1'\nbase: {adopt: /v}\nrequires: {sglang: '=>0.5'}\n",
     ":4: requires.sglang: '=>0.5' is not a version specifier"),
    ("name: [x\n", ":2: YAML error: expected ',' or ']'"),
])
def test_bad_specs_name_file_and_line(tmp_path: Path, body: str, error: str) -> None:
    spec = tmp_path / "r.yml"
    spec.write_text(body)
    with pytest.raises(InputError) as err:
        load_spec(spec)
    assert str(err.value).startswith(f"{spec}{error}"), str(err.value)


def test_command_env_and_host_overrides(tmp_path: Path) -> None:
    spec = load_spec(RELEASES / "ddtree-sglang-0.5.23.yml")
    layout = layout_for({"service_host": "10.0.0.5", "service_port": 31000, "fleetctl_root": "/srv/fc"})
    argv = command(spec, layout)
    assert argv[:3] == ["/srv/fc/current/venv/bin/python", "-m", "sglang.launch_server"]
    assert argv[-4:] == ["--host", "10.0.0.5", "--port", "31000"]
    assert "DDTREE" in argv
    env = env_file(spec, {"HF_TOKEN": "a b$c"}).splitlines()
    assert "SGLANG_DDTREE_MAX_TOPK=4" in env and "HF_TOKEN='a b$c'" in env
    with pytest.raises(InputError, match="service_manager must be systemd or process"):
        layout_for({"service_manager": "upstart"})


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """The rendered unit passes ``systemd-analyze verify`` (with its ExecStart made real in a tmp root)."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is not installed (Debian package systemd)")
    spec = load_spec(RELEASES / "ddtree-sglang-0.5.23.yml")
    root = tmp_path / "fleetctl"
    (root / "current" / "venv" / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", root / "current" / "venv" / "bin" / "python")
    (root / "current" / "service.env").write_text(env_file(spec))
    text = unit(spec, HostLayout(root=str(root)))
    assert f"ExecStart={root}/current/venv/bin/python -m sglang.launch_server" in text
    path = tmp_path / "fleetctl-sglang.service"
    path.write_text(text)
    proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert systemd_quote("50%") == "50%%" and systemd_quote("$HOME") == "'$$HOME'"


def test_unit_template_is_strict(tmp_path: Path) -> None:
    from jinja2 import Environment, StrictUndefined, UndefinedError

    src = (TEMPLATES / "sglang.service.j2").read_text()
    with pytest.raises(UndefinedError):
        Environment(undefined=StrictUndefined).from_string(src).render()
    assert textwrap.dedent(src).startswith("# Rendered by fleetctl")


def test_sglang_parser_sees_the_launch_args_without_the_stand_ins_own_flags() -> None:
    """The controller (launch-args check) and the stand-in (its own parser check) leave out the same
    ``--standin-*`` flags, and the release core gets that from release/service.py, not the lab."""
    import argparse

    from fleetctl.lab import fake_sglang
    from fleetctl.release.service import without_standin

    launch = ["--model-path", "/m", "--standin-accept-length", "3.5", "--standin-health-hang", "--tp", "2",
              "--standin-start-delay=1", "--speculative-algorithm", "DFLASH", "--standin-decode-tps", "-1",
              "--standin-bind-delay", "2"]
    expected = ["--model-path", "/m", "--tp", "2", "--speculative-algorithm", "DFLASH"]
    opts = argparse.Namespace(health_status=200, accept_length=3.0, decode_tps=100.0, start_delay=0.0,
                              health_hang=False, bind_delay=0.0)
    assert without_standin(launch) == expected
    assert fake_sglang.sglang_flags(launch, opts) == expected
    core = Path(__file__).resolve().parents[1] / "fleetctl" / "release"
    assert not [p.name for p in core.glob("*.py") if "fleetctl.lab" in p.read_text()]
