"""The release spec's ``models:``: each model a release needs, by role (``main``, ``draft``, ...).

A model is either a plain folder (``path``, optionally the ``revision`` its manifest must name: the
content id ``sha256:...`` that ``models status`` shows) or a Hugging Face repo pinned at a 40-hex commit
inside a cache (``hf_cache``, ``repo``, ``revision``). Launch args refer to them as templates:
``--model-path "{{ models.main.path }}"`` (the folder, or the snapshot folder of the cache).
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from fleetctl.models.ref import ModelRef

ROLE = r"^[A-Za-z_][A-Za-z0-9_]*$"  # a Jinja2 attribute: models.<role>.path
HEX40 = r"^[0-9a-f]{40}$"


class ModelSource(BaseModel):
    """One model a release serves: a folder on the hosts, or a Hugging Face repo pinned in a cache."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    path: str | None = None
    """A plain model folder on the hosts (absolute), holding ``.fleetctl-manifest.json``."""
    hf_cache: str | None = None
    """A Hugging Face cache folder on the hosts (absolute); goes with ``repo`` and ``revision``."""
    repo: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The Hub repo, ``ORG/NAME`` (with ``hf_cache``)."""
    revision: str | None = Field(default=None, min_length=1, max_length=80)
    """The 40-hex commit (with ``hf_cache``); for a folder, the content id its manifest must name."""

    @model_validator(mode="after")
    def _one_layout(self) -> ModelSource:
        if (self.path is None) == (self.hf_cache is None):
            raise ValueError("give either path (a model folder) or hf_cache with repo and revision")
        where = self.path if self.path is not None else self.hf_cache
        if not where or not where.startswith("/") or "{{" in where:
            raise ValueError(f"{where!r}: a model's folder is an absolute path on the hosts")
        if self.hf_cache is not None:
            if self.repo is None or self.revision is None:
                raise ValueError("hf_cache needs repo (ORG/NAME) and revision (a 40-hex commit)")
            if len(self.revision) != 40 or any(c not in "0123456789abcdef" for c in self.revision):
                raise ValueError(f"revision {self.revision!r} must be a 40-hex commit (a branch such as main moves)")
        elif self.repo is not None:
            raise ValueError("repo goes with hf_cache; a folder model has path (and optionally revision)")
        return self


def check_roles(value: dict[str, ModelSource]) -> dict[str, ModelSource]:
    """The spec's ``models:`` keys are names templates can use: ``models.<role>.path``."""
    import re

    for role in value:
        if not re.match(ROLE, role):
            raise ValueError(f"models: {role!r} is not a name templates can use (letters, digits, _)")
    return value


Models = Annotated[dict[str, ModelSource], AfterValidator(check_roles)]


def refs(models: dict[str, ModelSource]) -> list[ModelRef]:
    out = []
    for role, src in models.items():
        if src.path is not None:
            out.append(ModelRef(role, "folder", posixpath.normpath(src.path), None, src.revision))
        else:
            assert src.hf_cache is not None
            out.append(ModelRef(role, "hf_cache", posixpath.normpath(src.hf_cache), src.repo, src.revision))
    return out


def template_vars(models: dict[str, ModelSource]) -> dict[str, dict[str, Any]]:
    """``models.<role>.path`` / ``.revision`` / ``.repo`` for the spec's templates."""
    return {r.role: {"path": r.path, "revision": r.revision or "", "repo": r.repo or ""} for r in refs(models)}


def folder_ref(path: str) -> ModelRef:
    """A model folder named on the command line (``models status /models/X``)."""
    clean = posixpath.normpath(path)
    if not clean.startswith("/"):
        raise ValueError(f"{path!r}: a model folder on the hosts is an absolute path")
    return ModelRef(posixpath.basename(clean) or "model", "folder", clean, None, None)
