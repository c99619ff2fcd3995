"""Launch arguments checked by the installed SGLang itself, before anything switches.

Each host parses the release's server arguments (the spec's ``service.args`` plus the host and
port fleetctl adds; with instances, EACH instance's final argv: the base args with its overrides,
rendered for this host, and its own port) with SGLang's own parser, imported once for them all,
in the venv that will serve them: the built release's venv on a deploy, the base venv with the
patched files read from memory in ``--check`` (so a flag a patch adds is known there too). A
rejection is SGLang's own line, naming the instance. Where SGLang cannot be imported (a
``--no-deps`` venv without torch), the result says so: "launch args not validated: <why>", never
a silent pass. The stand-in's own ``--standin-*`` flags are not SGLang's and are left out.

A service that is not SGLang is checked by its own program's parser, never SGLang's: the SGLang
Model Gateway (``service.module: smg``, args ``[launch, ...]``) by ``smg.launch_router
.parse_router_args`` (argparse plus its own validation; no server started). A module fleetctl knows
no parser for is "launch args not validated", said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetctl.release import instances
from fleetctl.release.instances import ServerInstance
from fleetctl.release.service import HostLayout, launch_args, listen, without_standin
from fleetctl.release.spec import ReleaseSpec
from fleetctl.transport.base import HostSession

TIMEOUT_S = 600.0  # importing sglang imports torch: ~11 s on a 2-core machine, more on a busy one
# The program a service runs (``service.module``, run as ``python -m MODULE``) -> the host-side parser.
PARSERS = {"sglang.launch_server": "sglang", "smg": "smg"}


def parser_for(module: str) -> str | None:
    """Whose parser checks a service's launch args: SGLang's for its server, smg's for the gateway."""
    return PARSERS.get(module)


@dataclass(frozen=True)
class LaunchCheck:
    validated: bool
    ok: bool
    detail: str  # SGLang's rejection, or why nothing was validated, or what accepted them

    @property
    def refused(self) -> bool:
        return self.validated and not self.ok

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def server_argv(spec: ReleaseSpec, layout: HostLayout, inst: ServerInstance | None = None) -> list[str]:
    """What SGLang's parser sees for one server: its args (an instance's: the base args with its
    overrides) without the stand-in's, plus --host/--port."""
    kept = without_standin(launch_args(spec, layout, inst), spec.model.service.standin)
    host, port = listen(spec, layout, inst)
    return kept if {"--host", "--port"} & set(kept) else [*kept, "--host", host, "--port", str(port)]


def check_launch_args(session: HostSession, spec: ReleaseSpec, layout: HostLayout, venv: str,
                      overlay: dict[str, str] | None = None) -> LaunchCheck:
    module = spec.model.service.module
    parser = parser_for(module)
    if parser is None:
        return LaunchCheck(False, True, f"launch args not validated: no parser known for {module} "
                                        f"(known: {', '.join(sorted(PARSERS))})")
    argvs = [[inst.name, server_argv(spec, layout, inst)] for inst in instances.of_spec(spec)]
    answer = session.call("launch_args", {"argvs": argvs, "overlay": overlay or {}, "parser": parser},
                          python=f"{venv}/bin/python", timeout=TIMEOUT_S)
    if not answer.get("validated"):
        return LaunchCheck(False, True, f"launch args not validated: {answer.get('why', 'unknown')}")
    program = f"{parser} {answer.get('version') or answer.get('sglang') or '?'}"
    if answer.get("ok"):
        return LaunchCheck(True, True, f"accepted by {program}'s parser ({answer.get('seconds', 0):g}s)")
    of = f" of instance {answer['instance']}" if answer.get("instance") else ""
    return LaunchCheck(True, False, f"{program} rejects the launch args{of}: {answer.get('error', '')}")


def patched_overlay(site: str, files: dict[str, Any]) -> dict[str, str]:
    """The patched (or added) Python files as the venv will hold them, by absolute path."""
    return {f"{site}/{path}": text for path, text in files.items() if text is not None and path.endswith(".py")}
