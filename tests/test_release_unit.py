"""Release pieces that need no host: the spec's errors, the service command, env file and unit."""

from __future__ import annotations

import os
import re
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
    assert f'ExecStart="{root}/current/venv/bin/python" "-m" "sglang.launch_server"' in text
    path = tmp_path / "fleetctl-sglang.service"
    path.write_text(text)
    proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert systemd_quote("50%") == '"50%%"' and systemd_quote("$HOME") == '"$$HOME"'


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
    assert without_standin(launch, standin=True) == expected
    assert without_standin(launch, standin=False) == launch  # a real spec's args reach SGLang whole
    assert fake_sglang.sglang_flags(launch, opts) == expected
    core = Path(__file__).resolve().parents[1] / "fleetctl" / "release"
    assert not [p.name for p in core.glob("*.py") if "fleetctl.lab" in p.read_text()]


# Hostile values for the unit and the env file: quotes, ;, ||, $(), `, %, backslashes (JSON), unicode.
HOSTILE = ["a b", "'; touch /tmp/x; '", '"; touch /tmp/x; "', ";", "x || touch /tmp/x &", "$(touch /tmp/x)",
           "`id`", "${HOME}", "$$", "50%", "%n%i", "\\", "C:\\new\\x41\\", '{"a": "b\\"c"}', "-", "@x",
           "ünïcødé ✓ 日本", "", " lead and trail "]
UNCARRIABLE = ["\n", "\r", "\0", "\t", "\x1b", "\x85", "\u2028"]


def hostile_spec(tmp_path: Path, args: list[str], env: dict[str, str]) -> Path:
    import json

    path = tmp_path / "hostile.yml"
    path.write_text("name: hostile\nversion: '1'\nbase: {adopt: /v}\nservice:\n"
                    f"  args: {json.dumps(args)}\n  env: {json.dumps(env)}\n")
    return path


def systemd_argv(tmp_path: Path, text: str) -> list[str]:
    """ExecStart as systemd itself parsed it: ``systemd --test`` (as nobody: it refuses root; it
    loads units and starts nothing) dumps each unit's "Command Line", which it writes quoted for a
    shell; ``$$`` is left for exec time, where systemd turns it into ``$`` (systemd.service)."""
    import tempfile

    if not Path("/lib/systemd/systemd").exists():
        pytest.fail("/lib/systemd/systemd is not installed (Debian package systemd)")
    units = Path(tempfile.mkdtemp(prefix="fleetctl-unit-", dir="/var/tmp"))
    try:
        units.chmod(0o755)
        (units / "hostile.service").write_text(text)
        (units / "hostile.service").chmod(0o644)
        proc = subprocess.run(["runuser", "-u", "nobody", "--", "/lib/systemd/systemd", "--test", "--system",
                               "--unit=hostile.service", "--log-target=console"],
                              env={"SYSTEMD_UNIT_PATH": f"{units}:", "PATH": os.environ["PATH"]},
                              capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(units)
    ours = [part for part in proc.stdout.split("-> Unit ") if part.startswith("hostile.service:")]
    assert len(ours) == 1, (proc.stdout[-3000:], proc.stderr[-3000:])
    lines = [line.split("Command Line: ", 1)[1] for line in ours[0].splitlines() if "Command Line: " in line]
    assert len(lines) == 1, (proc.stdout[-3000:], proc.stderr[-3000:])  # one command: nothing injected
    return [word.replace("$$", "$") for word in dumped_words(lines[0])]


def dumped_words(line: str) -> list[str]:
    """systemd's dump quotes a word that needs it in double quotes with a backslash before each of
    ``"\\`$`` (shell_maybe_quote); we send no character that it would write in C escapes."""
    words = re.findall(r'"((?:[^"\\]|\\.)*)"(?=\s|$)|(\S+)', line)
    return [re.sub(r"\\(.)", r"\1", quoted) if quoted or not bare else bare for quoted, bare in words]


def test_hostile_args_and_env_reach_systemd_and_the_supervisor_as_one_value_each(tmp_path: Path) -> None:
    """Every hostile value, in the spec's args and env and through a host variable templated into
    both, comes back from systemd's own parse of the unit as exactly the argument it was, and from
    the env file as exactly the value (read by the supervisor; one line per variable)."""
    from fleetctl.remote.supervisor import read_env

    args = [a for value in HOSTILE for a in ("--x", value)] + ["--tag", "{{ cloud_tag }}"]
    env = {f"V{i}": value for i, value in enumerate(HOSTILE)} | {"TAG": "{{ cloud_tag }}"}
    tag = "t'\"; $(id) || `id` %n \\ ✓"
    spec = load_spec(hostile_spec(tmp_path, args, env))
    layout = layout_for({"fleetctl_root": "/srv/f 100%", "cloud_tag": tag})
    argv = command(spec, layout)
    assert tag in argv and argv[0] == "/srv/f 100%/current/venv/bin/python"
    text = unit(spec, layout)
    assert systemd_argv(tmp_path, text) == argv
    assert "EnvironmentFile=/srv/f 100%%/current/service.env" in text.splitlines()
    body = env_file(spec, host_vars=layout.host_vars)
    assert len(body.splitlines()) == len(env) + 2  # the header, HF_HUB_OFFLINE and one line each
    (tmp_path / "service.env").write_text(body)
    expected = {k: v for k, v in env.items() if k != "TAG"} | {"TAG": tag, "HF_HUB_OFFLINE": "1"}
    assert read_env(str(tmp_path / "service.env")) == expected


@pytest.mark.parametrize("char", UNCARRIABLE)
def test_a_value_systemd_cannot_carry_is_refused_naming_where(tmp_path: Path, char: str) -> None:
    payload = f"x{char}ExecStartPre=/usr/bin/touch /tmp/pwn{char}X-Z="
    cases = [(["--model-path", payload], {}, {}, r"service\.args\[1\]:"),
             ([], {"EVIL": payload}, {}, r"service\.env\.EVIL:"),
             (["--tag", "{{ cloud_tag }}"], {}, {"cloud_tag": payload},
              r"service\.args\[1\] \(from host variable cloud_tag\):"),
             ([], {"TAG": "tag-{{ cloud_tag }}"}, {"cloud_tag": payload},
              r"service\.env\.TAG \(from host variable cloud_tag\):")]
    for args, env, host_vars, where in cases:
        spec = load_spec(hostile_spec(tmp_path, args, env))
        with pytest.raises(InputError, match=f"^{re.escape(str(spec.path))}: {where} .* cannot be carried by a "
                                             "systemd unit") as err:
            unit(spec, layout_for(host_vars)) if args else env_file(spec, host_vars=host_vars)
        assert "\n" not in str(err.value) and "\r" not in str(err.value)
    with pytest.raises(InputError, match="host variable fleetctl_root: .* cannot be carried"):
        layout_for({"fleetctl_root": f"/opt/x{char}ExecStartPre=/bin/true"})


def test_a_rank_above_0_is_gated_on_what_it_serves() -> None:
    from fleetctl.release.nodegroups import rank_of, serving_health
    from fleetctl.release.spec import Health

    health = Health.model_validate({"path": "/health_generate", "warmup": {"requests": 1},
                                    "thresholds": [{"field": "max_total_num_tokens", "min": 1}],
                                    "canary": {"max_regression_percent": 10}, "probes": [{"import": "sglang"}]})
    assert serving_health(health, {"nnodes": 2, "node_rank": 0}) is health
    assert serving_health(health, {}) is health and rank_of({"node_rank": 1}) == 0  # no group: no rank
    ranked = serving_health(health, {"nnodes": 2, "node_rank": 1})
    assert (ranked.path, ranked.warmup, ranked.thresholds, ranked.canary) == ("/health_generate", None, [], None)
    assert ranked.probes == health.probes
    assert serving_health(Health.model_validate({"path": "/server_info"}), {"nnodes": 3, "node_rank": 2}).path \
        == "/health"
