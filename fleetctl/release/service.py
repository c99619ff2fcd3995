"""What the service runs: the launch command, its environment file and its systemd unit (pure).

The service always runs ``ROOT/current/venv/bin/python``: switching ``current`` and restarting
is the whole of a rollout or a rollback.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from jinja2 import TemplateError

from fleetctl import hostpaths, templating
from fleetctl.errors import InputError
from fleetctl.release.instances import ServerInstance, merge_args
from fleetctl.release.spec import ReleaseSpec

TEMPLATES = Path(__file__).resolve().parent / "templates"  # package data: the wheel carries it
STANDIN = Path(__file__).resolve().parents[1] / "lab" / "fake_sglang.py"
STANDIN_NAME = "sglang_standin.py"
STANDIN_API = STANDIN.with_name("fake_sglang_api.py")  # the stand-in's answers, shipped beside it (its import name)
SUPERVISOR = Path(__file__).resolve().parents[1] / "remote" / "supervisor.py"


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


LAYOUT_VARS = (hostpaths.ROOT_VAR, hostpaths.STATE_VAR, "service_host", "service_port", "service_manager")


def layout_for(host_vars: Mapping[str, object]) -> HostLayout:
    """Host vars ``fleetctl_root``, ``fleetctl_state_dir``, ``service_host``, ``service_port`` and
    ``service_manager`` (systemd | process; detected on the host when unset); each may be a template
    over the host's variables (``service_port: "{{ base_port + 1 }}"``), rendered here."""
    lazy = templating.LazyVars(host_vars)
    try:
        found = {name: lazy.get(name) for name in LAYOUT_VARS}
    except templating.TemplateProblem as exc:
        raise InputError(f"host variables: {exc}") from None
    port, manager = found["service_port"], found["service_manager"]
    if manager not in (None, "systemd", "process"):
        raise InputError(f"service_manager must be systemd or process, got {manager!r}")
    if port and not str(port).strip().isdigit():
        raise InputError(f"service_port must be a port number, got {port!r}")
    for name in LAYOUT_VARS[:3]:  # they land in the unit file and the supervisor's config, one line each
        refuse_uncarriable(f"host variable {name}", str(found[name] or ""))
    return HostLayout(hostpaths.root(found), hostpaths.state_dir(found),
                      str(found["service_host"]) if found["service_host"] else None,
                      int(str(port)) if port else None, str(manager) if manager else None, host_vars)


def launch_args(spec: ReleaseSpec, layout: HostLayout, inst: ServerInstance | None = None) -> list[str]:
    """The spec's ``service.args``, each a Jinja2 template rendered with this host's variables
    (``--tp, "{{ tp_size }}"``): one spec, the same release id, per-host launch arguments. An
    instance's own args replace the service's flags of the same name and add the rest."""
    base = [render_value(spec, f"service.args[{i}]", arg, render_vars(spec, layout))
            for i, arg in enumerate(spec.model.service.args)]
    if inst is None or inst.name is None:
        return base
    own = [render_value(spec, f"service.instances.{inst.name}.args[{i}]", arg, render_vars(spec, layout))
           for i, arg in enumerate(inst.args)]
    return merge_args(base, own)


def listen(spec: ReleaseSpec, layout: HostLayout, inst: ServerInstance | None = None) -> tuple[str, int]:
    """Where the server listens: an instance's own port, else the host var ``service_port``, else the spec's."""
    svc = spec.model.service
    if inst is not None and inst.name is not None:
        raw, key = inst.port, f"service.instances.{inst.name}.port"
    else:
        raw, key = layout.service_port or svc.port, "service.port"
    text = render_value(spec, key, str(raw), render_vars(spec, layout))
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise InputError(f"{spec.path}: {key}: {text!r} is not a port number")
    return layout.service_host or svc.host, int(text)


def command(spec: ReleaseSpec, layout: HostLayout, inst: ServerInstance | None = None) -> list[str]:
    svc = spec.model.service
    python = f"{layout.current}/venv/bin/python"
    host, port = listen(spec, layout, inst)
    args = launch_args(spec, layout, inst)
    where = [] if {"--host", "--port"} & set(args) else ["--host", host, "--port", str(port)]
    if svc.standin:  # lab hosts have no GPU: fleetctl's stand-in answers SGLang's health surface
        return [python, f"{layout.current}/{STANDIN_NAME}", "--release-dir", layout.current, *where, "--", *args]
    return [python, "-m", svc.module, *args, *where]


def env_file(spec: ReleaseSpec, extra: dict[str, str] | None = None,
             host_vars: Mapping[str, object] | None = None, inst: ServerInstance | None = None) -> str:
    """systemd EnvironmentFile syntax; values are quoted so spaces and $ stay literal. A value may name
    the host's inventory variables (``HF_TOKEN: "{{ HF_TOKEN }}"``); the file is 0600 on the host, and
    callers that show it pass vars with secrets masked. An instance adds its env and its GPUs."""
    svc = spec.model.service
    values = dict(host_vars or {})
    if spec.model.models:
        from fleetctl.models.spec import template_vars

        values["models"] = template_vars(spec.model.models)
    env = {key: render_value(spec, f"service.env.{key}", value, values) for key, value in svc.env.items()}
    gpus, gpus_key = svc.gpus, "service.gpus"
    if inst is not None and inst.name is not None:
        env.update({key: render_value(spec, f"service.instances.{inst.name}.env.{key}", value, values)
                    for key, value in inst.env.items()})
        if inst.gpus is not None:
            gpus, gpus_key = inst.gpus, f"service.instances.{inst.name}.gpus"
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = render_value(spec, gpus_key, gpus, values)
    # A model missing on the host fails at once instead of downloading in silence (the spec may say otherwise).
    env.setdefault("HF_HUB_OFFLINE", "1")
    for key, value in (extra or {}).items():
        refuse_uncarriable(f"{spec.path}: service environment {key}", value)
    env.update(extra or {})
    lines = [f"# fleetctl release {spec.release_id}" + (f" instance {inst.name}" if inst and inst.name else "")]
    for key, value in sorted(env.items()):
        if not ENV_NAME.fullmatch(key):
            raise InputError(f"{spec.path}: service.env: {key!r} is not a variable name")
        lines.append(f"{key}={_quote(value)}")
    return "\n".join(lines) + "\n"


def render_vars(spec: ReleaseSpec, layout: HostLayout) -> Mapping[str, object]:
    """The host's variables, and ``models`` (``{{ models.main.path }}``) when the spec names models."""
    if not spec.model.models:
        return layout.host_vars
    from collections import ChainMap

    from fleetctl.models.spec import template_vars

    return ChainMap({"models": template_vars(spec.model.models)}, dict(layout.host_vars))


def render_value(spec: ReleaseSpec, key: str, value: str, host_vars: Mapping[str, object] | None) -> str:
    """One spec value rendered as playbooks render (fleetctl.templating): the host's variables
    templated lazily (a group_vars value that is a template is rendered too), ``lookup`` and filters.
    A value systemd cannot carry (a control character) is refused, naming the key and the host
    variable it came from."""
    refuse_uncarriable(f"{spec.path}: {key}", value)
    if not templating.is_template(value):
        return value
    try:  # text, as the value lands in a command line or an env file: "{{ gpus }}" of "0,1" stays "0,1"
        text = templating.render_text(value, host_vars or {})
    except templating.TemplateProblem as exc:
        raise InputError(f"{spec.path}: {key}: {exc}") from None
    except TemplateError as exc:
        raise InputError(f"{spec.path}: {key}: {exc.message or exc}") from None
    culprits = [name for name, var in (host_vars or {}).items()
                if name in value and uncarriable(str(var))]  # "{{ NAME }}" names it
    where = f" (from host variable {', '.join(sorted(culprits))})" if culprits else ""
    refuse_uncarriable(f"{spec.path}: {key}{where}", text)
    return text


def uncarriable(value: str) -> str | None:
    """The first character of ``value`` that a unit file, an EnvironmentFile or the supervisor's
    line-based env file cannot carry as data: control characters (newline, CR, NUL, tab, C1),
    line and paragraph separators, and lone surrogates (no UTF-8 for them)."""
    for char in value:
        if unicodedata.category(char) in ("Cc", "Zl", "Zp", "Cs"):
            return char
    return None


def refuse_uncarriable(where: str, value: str) -> None:
    char = uncarriable(value)
    if char is not None:
        raise InputError(f"{where}: {ascii(char)} (U+{ord(char):04X}) cannot be carried by a systemd unit or "
                         f"env file: remove it from the value")


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what systemd (env_name_is_valid) and a shell accept


def _quote(value: str) -> str:
    """An EnvironmentFile value (systemd.exec: shell-like; within single quotes every character is
    literal, backslash included, and quoted runs concatenate). Control characters never get here."""
    return value if value and all(c.isascii() and (c.isalnum() or c in "._-/:,=@+") for c in value) \
        else shlex.quote(value)


def unit(spec: ReleaseSpec, layout: HostLayout, inst: ServerInstance | None = None) -> str:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined, keep_trailing_newline=True,
                      autoescape=False)
    inst = inst or ServerInstance()
    return env.get_template("sglang.service.j2").render(
        release_id=spec.release_id, env_file=systemd_path(f"{layout.current}/{inst.env_name}"), instance=inst.name,
        command=[systemd_quote(c) for c in command(spec, layout, inst)], workdir=systemd_path(layout.current),
        stop_timeout=spec.model.service.stop_timeout, user=spec.model.service.user)


def systemd_quote(arg: str) -> str:
    """One ExecStart word by systemd's rules (systemd.service "Command lines", systemd.syntax
    "Quoting"): always in double quotes, so ``;`` or a leading ``-``/``@`` is data; ``\\`` and ``"``
    C-escaped; specifiers (``%``) and variable expansion (``$``) doubled. Control characters, which
    would end the line, are refused before (refuse_uncarriable)."""
    refuse_uncarriable("ExecStart argument", arg)
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def systemd_path(path: str) -> str:
    """A path setting (EnvironmentFile=, WorkingDirectory=): taken whole, specifiers expanded."""
    refuse_uncarriable("unit path", path)
    return path.replace("%", "%%")


def stored_params(spec: ReleaseSpec, layout: HostLayout, inst: ServerInstance | None = None) -> dict[str, object]:
    """Written into the release folder as ``service.json`` (an instance's: ``service.NAME.json``);
    restarts read it from ``current``."""
    svc, inst = spec.model.service, inst or ServerInstance()
    health = inst.health or spec.model.health
    host, port = listen(spec, layout, inst)
    return {"release_id": spec.release_id, "command": command(spec, layout, inst), "instance": inst.name,
            "env_file": f"{layout.current}/{inst.env_name}", "cwd": layout.current, "timeout": svc.stop_timeout,
            "unit": unit(spec, layout, inst), "host": host, "port": port, "health_path": health.path,
            "user": svc.user, "manager": None if svc.manager == "auto" else svc.manager,
            **({"models": {m.role: m.to_dict() for m in spec.models}} if spec.models else {}),
            # rollback and service, which take no spec, group a multi-node server's hosts by it
            **({"node_group": svc.node_group} if svc.node_group else {}),
            # service start|restart poll /health as the deploy did (kept only when not the default, so a
            # release deployed before this field stays unchanged: no reconfigure)
            **({"health_interval": health.interval} if health.interval != 1.0 else {})}


def control(layout: HostLayout, op: str, instance: str | None = None) -> dict[str, object]:
    """Params for ``remote/service_host.py``: start/restart take the rest from current's service.json
    (an instance's service.NAME.json; it also holds the spec's ``service.manager``); the host var
    ``service_manager`` wins. Start and restart carry the supervisor's source (it is kept on the
    host, so a server comes back after a reboot)."""
    inst = ServerInstance(instance)
    params: dict[str, object] = {"op": op, "name": inst.unit_name, "state_dir": layout.state_dir,
                                 "manager": layout.service_manager,
                                 "params_file": f"{layout.current}/{inst.params_name}"}
    if op in ("start", "restart"):
        params["supervisor_source"] = SUPERVISOR.read_text(encoding="utf-8")
    return params


# The stand-in's own knobs (fleetctl/lab/fake_sglang.py, add_standin_flags): all take a value but this one.
STANDIN_SWITCHES = frozenset({"--standin-health-hang"})


def without_standin(launch: list[str], standin: bool) -> list[str]:
    """For a stand-in spec (``service.standin``), the launch args without the stand-in's own
    ``--standin-*`` flags and their values: what the real SGLang parser would be given. Any other
    spec's args are SGLang's, whole: a ``--standin-*`` there is SGLang's to refuse."""
    if not standin:
        return list(launch)
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
