"""What the service runs: the launch command, its environment file and its systemd unit (pure).

The service always runs ``ROOT/current/venv/bin/python``: switching ``current`` and restarting
is the whole of a rollout or a rollback.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fleetctl import hostpaths
from fleetctl.errors import InputError
from fleetctl.release.spec import ReleaseSpec

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
STANDIN = Path(__file__).resolve().parents[1] / "lab" / "fake_sglang.py"
STANDIN_NAME = "sglang_standin.py"


@dataclass(frozen=True)
class HostLayout:
    """Where releases and state live on one host, and where its service listens (host vars
    ``service_host``/``service_port`` override the spec's: lab hosts share one network)."""

    root: str = hostpaths.DEFAULT_ROOT
    state_dir: str = hostpaths.DEFAULT_STATE_DIR
    service_host: str | None = None
    service_port: int | None = None
    service_manager: str | None = None
    # The host's variables: the spec's service.args, gpus and env are templates rendered with them.
    host_vars: Mapping[str, object] = field(default_factory=dict, compare=False, repr=False)

    @property
    def current(self) -> str:
        return f"{self.root}/current"

    def params(self) -> dict[str, str]:
        return {"root": self.root, "state_dir": self.state_dir}


def layout_for(host_vars: dict[str, object]) -> HostLayout:
    """Host vars ``fleetctl_root``, ``fleetctl_state_dir``, ``service_host``, ``service_port`` and
    ``service_manager`` (systemd | process; detected on the host when unset)."""
    port, manager = host_vars.get("service_port"), host_vars.get("service_manager")
    if manager not in (None, "systemd", "process"):
        raise InputError(f"service_manager must be systemd or process, got {manager!r}")
    return HostLayout(hostpaths.root(host_vars), hostpaths.state_dir(host_vars),
                      str(host_vars["service_host"]) if host_vars.get("service_host") else None,
                      int(str(port)) if port else None, str(manager) if manager else None, host_vars)


def launch_args(spec: ReleaseSpec, layout: HostLayout) -> list[str]:
    """The spec's ``service.args``, each a Jinja2 template rendered with this host's variables
    (``--tp, "{{ tp_size }}"``): one spec, the same release id, per-host launch arguments."""
    return [render_value(spec, f"service.args[{i}]", arg, layout.host_vars)
            for i, arg in enumerate(spec.model.service.args)]


def listen(spec: ReleaseSpec, layout: HostLayout) -> tuple[str, int]:
    svc = spec.model.service
    return layout.service_host or svc.host, layout.service_port or svc.port


def command(spec: ReleaseSpec, layout: HostLayout) -> list[str]:
    svc = spec.model.service
    python = f"{layout.current}/venv/bin/python"
    host, port = listen(spec, layout)
    args = launch_args(spec, layout)
    where = [] if {"--host", "--port"} & set(args) else ["--host", host, "--port", str(port)]
    if svc.standin:  # lab hosts have no GPU: fleetctl's stand-in answers SGLang's health surface
        return [python, f"{layout.current}/{STANDIN_NAME}", "--release-dir", layout.current, *where, "--", *args]
    return [python, "-m", svc.module, *args, *where]


def env_file(spec: ReleaseSpec, extra: dict[str, str] | None = None,
             host_vars: Mapping[str, object] | None = None) -> str:
    """systemd EnvironmentFile syntax; values are quoted so spaces and $ stay literal. A value may name
    the host's inventory variables (``HF_TOKEN: "{{ HF_TOKEN }}"``); the file is 0600 on the host, and
    callers that show it pass vars with secrets masked."""
    svc = spec.model.service
    env = {key: render_value(spec, f"service.env.{key}", value, host_vars) for key, value in svc.env.items()}
    if svc.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = render_value(spec, "service.gpus", svc.gpus, host_vars)
    env.update(extra or {})
    lines = [f"# fleetctl release {spec.release_id}"]
    for key, value in sorted(env.items()):
        if not key.isidentifier():
            raise ValueError(f"service.env: {key!r} is not a variable name")
        lines.append(f"{key}={_quote(value)}")
    return "\n".join(lines) + "\n"


def render_value(spec: ReleaseSpec, key: str, value: str, host_vars: Mapping[str, object] | None) -> str:
    if "{{" not in value and "{%" not in value:
        return value
    from jinja2 import Environment, StrictUndefined, TemplateError

    try:
        return Environment(undefined=StrictUndefined, autoescape=False).from_string(value).render(
            dict(host_vars or {}))
    except TemplateError as exc:
        raise InputError(f"{spec.path}: {key}: {exc}") from None


def _quote(value: str) -> str:
    return value if value and all(c.isalnum() or c in "._-/:,=@+" for c in value) else shlex.quote(value)


def unit(spec: ReleaseSpec, layout: HostLayout) -> str:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined, keep_trailing_newline=True,
                      autoescape=False)
    return env.get_template("sglang.service.j2").render(
        release_id=spec.release_id, env_file=f"{layout.current}/service.env",
        command=[systemd_quote(c) for c in command(spec, layout)], workdir=layout.current,
        stop_timeout=spec.model.service.stop_timeout, user=spec.model.service.user)


def systemd_quote(arg: str) -> str:
    """One ExecStart word: quoted like a shell word, with systemd's own specifiers (%) and
    variable expansion ($) escaped so the argument reaches the process unchanged."""
    return shlex.quote(arg).replace("%", "%%").replace("$", "$$")


def stored_params(spec: ReleaseSpec, layout: HostLayout) -> dict[str, object]:
    """Written into the release folder as ``service.json``; restarts read it from ``current``."""
    svc = spec.model.service
    return {"release_id": spec.release_id, "command": command(spec, layout),
            "env_file": f"{layout.current}/service.env", "cwd": layout.current, "timeout": svc.stop_timeout,
            "unit": unit(spec, layout), "host": listen(spec, layout)[0], "port": listen(spec, layout)[1],
            "health_path": spec.model.health.path, "user": svc.user,
            "manager": None if svc.manager == "auto" else svc.manager}


def control(layout: HostLayout, op: str) -> dict[str, object]:
    """Params for ``remote/service_host.py``: start/restart take the rest from current's service.json
    (which also holds the spec's ``service.manager``); the host var ``service_manager`` wins."""
    return {"op": op, "name": "sglang", "state_dir": layout.state_dir, "manager": layout.service_manager,
            "params_file": f"{layout.current}/service.json"}


# The stand-in's own knobs (fleetctl/lab/fake_sglang.py, add_standin_flags): all take a value but this one.
STANDIN_SWITCHES = frozenset({"--standin-health-hang"})


def without_standin(launch: list[str]) -> list[str]:
    """The launch args without the stand-in's own ``--standin-*`` flags and their values: what the
    real SGLang parser would be given."""
    kept: list[str] = []
    skip = False
    for arg in launch:
        if skip:
            skip = False
        elif arg.startswith("--standin-"):
            skip = "=" not in arg and arg not in STANDIN_SWITCHES
        else:
            kept.append(arg)
    return kept
