"""The kernels step of a release: the files of its ``kernels/configs/`` folder and SGLANG_MOE_CONFIG_DIR.

SGLANG_MOE_CONFIG_DIR replaces SGLang's built-in config folder, it does not add to it. So the folder
holds every built-in ``triton_*`` config of the base venv's sglang, with the tuned files for this
host's GPU written over them (tuned win on a name clash). All tuned folders for that GPU ship, so
SGLang applies its own rule (exact triton folder, else the newest other one); ``fleetctl kernels
plan`` shows which file it will load. The folder lives in the release folder, not in site-packages:
``drift --verify-files`` sees an untouched venv, and a rollback switches it along with ``current``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import HostError
from fleetctl.kernels import ENV_VAR, KernelPlan, gather, load_tuned, merged_folder, plan_host
from fleetctl.release.service import layout_for
from fleetctl.transport.base import HostSession

if TYPE_CHECKING:
    from fleetctl.release.spec import ReleaseSpec

KERNELS_DIR = "kernels"  # in the release folder; SGLang reads KERNELS_DIR/configs/triton_X_Y_Z/


class KernelsRefused(HostError):
    """The tuned configs cannot be placed on this host; nothing was changed there."""


@dataclass
class ReleaseKernels:
    files: dict[str, str]  # triton_X_Y_Z/name -> text, written under <release>/kernels/configs/
    env: dict[str, str]  # SGLANG_MOE_CONFIG_DIR for the service environment
    plan: KernelPlan
    replaced: list[str]  # built-in files a tuned one replaced

    def manifest(self) -> dict[str, Any]:
        """Recorded in the release's manifest.json (release_host adds every file's sha256)."""
        return {"dir": KERNELS_DIR, "env": self.env, "device_names": self.plan.facts.device_names,
                "triton_version": self.plan.facts.triton_version, "triton_folder": self.plan.facts.triton_folder,
                "sglang": self.plan.facts.sglang_version, "tuned": self.plan.selected,
                "replaced_builtin": self.replaced, "files": len(self.files), "warnings": self.plan.warnings}

    def describe(self) -> str:
        """For ``deploy --check --diff``: what the config folder will hold."""
        lines = [f"{len(self.files)} files; {ENV_VAR}={self.env[ENV_VAR]}"]
        lines += [f"+ {rel}" + (" (replaces the built-in file)" if rel in self.replaced else "")
                  for rel in self.plan.selected]
        lines += [f"warning: {w}" for w in self.plan.warnings]
        return "\n".join(lines) + "\n"


def tuned_dir(spec: ReleaseSpec) -> Path | None:
    """The spec's ``kernels: {dir: ...}``, relative to the spec file; None when it names none."""
    folder = spec.model.kernels.dir
    return spec.path.parent / folder if folder else None


def release_kernels(session: HostSession, spec: ReleaseSpec, base_venv: str) -> ReleaseKernels | None:
    """The release's config folder for this host (None when the spec has no ``kernels.dir``).
    Refused, before anything is written, where the GPU name or SGLang's built-in folder is unknown."""
    root = tuned_dir(spec)
    if root is None:
        return None
    tuned = load_tuned(root)
    facts, builtin = gather(session, base_venv, contents=True)
    if not facts.gpu_names:
        raise KernelsRefused(session.name, f"kernels: no GPU name ({facts.gpu_source}): set the host var "
                                           "gpu_name; nothing changed")
    if facts.builtin_dir is None:
        raise KernelsRefused(session.name, f"kernels: no SGLang fused-MoE config folder in {base_venv} (sglang "
                                           f"{facts.sglang_version or 'not installed'}) to merge the tuned files "
                                           "into; nothing changed")
    plan = plan_host(session.name, facts, tuned, builtin)
    if plan.refusals:  # SGLang on this host would stop at load: refuse before building anything
        raise KernelsRefused(session.name, "kernels: " + "; ".join(plan.refusals))
    files, replaced = merged_folder(builtin, tuned.for_devices(facts.device_names))
    current = layout_for(session.vars).current
    return ReleaseKernels(files, {ENV_VAR: f"{current}/{KERNELS_DIR}"}, plan, replaced)
