"""What a ``fleetctl models`` command was given: a release spec here (every model it names) or a model
folder on the hosts."""

from __future__ import annotations

from pathlib import Path

from fleetctl.errors import InputError
from fleetctl.models.spec import ModelRef, folder_ref
from fleetctl.release.spec import load_spec


def model_targets(arg: str) -> tuple[list[ModelRef], str]:
    """The models named by a release spec (a YAML file here) or a model folder on the hosts (an absolute
    path that is not a file here). Returns them and the spec's release id ("" for a folder)."""
    path = Path(arg)
    if path.suffix in (".yml", ".yaml") or path.is_file():
        spec = load_spec(path)
        if not spec.models:
            raise InputError(f"{path}: the release spec names no models (add a models: block)")
        return spec.models, spec.release_id
    try:
        return [folder_ref(arg)], ""
    except ValueError as exc:
        raise InputError(f"{exc} (or give a release spec file)") from None
