"""A manifest per model revision: every file's relative path, size and sha256, plus name, revision, layout.

One format, written by the host-side module ``fleetctl/remote/model_manifest.py`` (stdlib only), which this
module loads as is, so the controller and the hosts never disagree about it. Kept beside the model on each host:

- plain folder: ``<folder>/.fleetctl-manifest.json``
- Hugging Face cache: ``<cache>/models--ORG--NAME/.fleetctl/<40-hex revision>.manifest.json`` (per snapshot,
  outside ``snapshots/`` so that the Hub's tools see only the Hub's files)

sha256 comes from the blob name where the HF cache names a blob by 64 hex digits (LFS files); 40-hex (git-sha1)
blobs, the small files, are hashed and their git_sha1 kept; a plain folder is hashed once, at the source. A plain
folder's revision is its content id (``sha256:`` over the file list) unless a label is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from fleetctl.errors import FleetError
from fleetctl.transport.agent import REMOTE_DIR, module_source

FOLDER_MANIFEST = ".fleetctl-manifest.json"
HF_MANIFEST_DIR = ".fleetctl"


class ManifestError(FleetError):
    """A manifest that cannot be read or is not one (the message names the file)."""


@cache
def host_module() -> ModuleType:
    """fleetctl/remote/model_manifest.py, loaded as the agent ships it."""
    module = ModuleType("fleetctl_remote_model_manifest")
    module.__file__ = str(REMOTE_DIR / "model_manifest.py")
    exec(compile(module_source("model_manifest")[0], module.__file__, "exec"), module.__dict__)  # noqa: S102
    return module


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str
    git_sha1: str | None = None


@dataclass(frozen=True)
class Manifest:
    name: str
    revision: str
    layout: str  # "folder" | "hf_cache"
    files: tuple[ManifestFile, ...]
    repo: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def by_path(self) -> dict[str, ManifestFile]:
        return {f.path: f for f in self.files}

    def to_dict(self) -> dict[str, Any]:
        files = [{"path": f.path, "size": f.size, "sha256": f.sha256, **({"git_sha1": f.git_sha1} if f.git_sha1
                  else {})} for f in self.files]
        return dict(host_module().new_manifest(self.name, self.revision, self.layout, files, repo=self.repo))

    @classmethod
    def from_dict(cls, doc: Any, where: str) -> Manifest:
        try:
            doc = host_module().check(doc, where)
        except ValueError as exc:
            raise ManifestError(str(exc)) from None
        files = tuple(ManifestFile(f["path"], f["size"], f["sha256"], f.get("git_sha1")) for f in doc["files"])
        return cls(doc["name"], doc["revision"], doc["layout"], files, doc.get("repo"))


def manifest_path(layout: str, root: str, repo: str | None = None, revision: str | None = None) -> str:
    """Where a model's manifest is kept; ``root`` is the folder, or the HF cache."""
    return str(host_module().manifest_path(layout, root, repo, revision))


def loads(text: str, where: str) -> Manifest:
    try:
        doc = host_module().loads(text, where)
    except ValueError as exc:
        raise ManifestError(str(exc)) from None
    return Manifest.from_dict(doc, where)


def load(path: str | Path) -> Manifest:
    try:
        doc = host_module().load(str(path))
    except ValueError as exc:
        raise ManifestError(str(exc)) from None
    return Manifest.from_dict(doc, str(path))


def dumps(manifest: Manifest) -> str:
    return str(host_module().dumps(manifest.to_dict()))


def dump(manifest: Manifest, path: str | Path) -> str:
    """Write ``manifest`` to ``path`` atomically."""
    return str(host_module().dump(manifest.to_dict(), str(path)))


def build_from_folder(folder: str | Path, name: str | None = None, revision: str | None = None) -> Manifest:
    """Hash every file of a plain model folder (once, at the source)."""
    try:
        doc = host_module().build_from_folder(str(folder), name, revision)
    except (ValueError, OSError) as exc:
        raise ManifestError(str(exc)) from None
    return Manifest.from_dict(doc, str(folder))


def build_from_hf_cache(cache_dir: str | Path, repo: str, revision: str) -> Manifest:
    """The manifest of one snapshot of a HF cache: sha256 from the blob names where they are sha256."""
    try:
        doc = host_module().build_from_hf_cache(str(cache_dir), repo, revision)
    except (ValueError, OSError) as exc:
        raise ManifestError(str(exc)) from None
    return Manifest.from_dict(doc, f"{cache_dir}:{repo}@{revision}")
