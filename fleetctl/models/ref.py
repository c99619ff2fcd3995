"""``ModelRef``: one model of a release as the hosts hold it. Apart from the release spec's pydantic
models (fleetctl/models/spec.py), so that what only reads hosts' models (drift's stack rows) does not
import pydantic and build the spec's models: a tenth of a second of every drift run."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelRef:
    """One model of a release, as the hosts hold it."""

    role: str
    layout: str  # folder | hf_cache
    root: str  # the folder, or the cache
    repo: str | None
    revision: str | None  # the commit (hf_cache) or the manifest revision the spec pins (folder)

    @property
    def path(self) -> str:
        """What a server is given: the folder, or the snapshot of the pinned revision."""
        if self.layout == "folder":
            return self.root
        assert self.repo is not None and self.revision is not None
        return posixpath.join(self.root, "models--" + self.repo.replace("/", "--"), "snapshots", self.revision)

    def host_params(self) -> dict[str, Any]:
        """What fleetctl/remote/model_host.py takes."""
        if self.layout == "folder":
            return {"key": self.role, "layout": "folder", "path": self.root, "expect_revision": self.revision}
        return {"key": self.role, "layout": "hf_cache", "cache": self.root, "repo": self.repo,
                "revision": self.revision}

    def label(self) -> str:
        return f"{self.repo}@{self.revision}" if self.layout == "hf_cache" else self.root

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "layout": self.layout, "root": self.root, "path": self.path, "repo": self.repo,
                "revision": self.revision}
