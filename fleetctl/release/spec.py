"""The release spec: everything a host needs to serve, in one YAML file, checked with file:line errors.

Relative paths (patches, lock files, kernel folders) are relative to the spec file's folder.
The release id is ``<name>-<version>-<hash8>``: the hash covers the spec and every file it
refers to, so the same id means the same release on every host.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetctl import yamlfile
from fleetctl.models.spec import ModelRef, Models, refs

SLUG = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class _Strict(BaseModel):
    # A docstring under a field is its meaning: the release-spec reference is generated from them.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Base(_Strict):
    """Where the release's venv comes from: an existing venv on each host, or a pinned set."""

    adopt: str | None = None
    """An existing venv on each host (absolute path), cloned into each release."""
    lock: str | None = None
    """A lock file (pinned requirements) the base venv is built from, once per lock under bases/."""
    wheelhouse: str | None = None
    """A folder of wheels for ``lock``, uploaded to hosts that lack them (offline install)."""
    python: str | None = None
    """The interpreter a ``lock`` base is created with (default: the host's python3)."""

    @model_validator(mode="after")
    def _one_source(self) -> Base:
        if (self.adopt is None) == (self.lock is None):
            raise ValueError("give exactly one of adopt (an existing venv on each host) or lock (a lock file)")
        if self.adopt is not None and not self.adopt.startswith("/"):
            raise ValueError("adopt must be an absolute path on the host")
        return self


class PatchRef(_Strict):
    file: str | None = None
    """A unified diff, applied exactly (no fuzz) to the installed files of ``distribution``."""
    series: str | None = None
    """A series.yml listing patch files, each with its distribution and version."""
    distribution: str | None = None
    """The distribution ``file`` patches (``sglang``)."""
    version: str | None = None
    """The version ``file`` was made against; a host with another version is refused."""

    @model_validator(mode="after")
    def _file_or_series(self) -> PatchRef:
        if (self.file is None) == (self.series is None):
            raise ValueError("give either file (with distribution and version) or series")
        if self.file is not None and not (self.distribution and self.version):
            raise ValueError("a patch file needs the distribution and version it was made for")
        return self


class ProbeGate(_Strict):
    symbol: str | None = None
    """A symbol that must be defined in ``package`` (``SpeculativeAlgorithm.DDTREE``)."""
    import_: str | None = Field(default=None, alias="import")
    """A module (``MODULE[:ATTR]``) that must import in the release's venv."""
    package: str = "sglang"
    """The installed package ``symbol`` is looked for in."""
    expect: Literal["present", "absent"] = "present"
    """Whether the symbol or import must be there or must not."""

    @model_validator(mode="after")
    def _one(self) -> ProbeGate:
        if (self.symbol is None) == (self.import_ is None):
            raise ValueError("a probe gate is either symbol: NAME or import: MODULE[:ATTR]")
        return self


class Threshold(_Strict):
    field: str
    """A dotted field of the JSON answer (``internal_states.0.avg_spec_accept_length``)."""
    path: str = "/server_info"
    """The server path asked."""
    min: float | None = None
    """The gate fails below this."""
    max: float | None = None
    """The gate fails above this."""
    timeout: float = Field(default=10.0, gt=0)
    """Seconds the server may take to answer; no answer by then fails the gate."""


class Warmup(_Strict):
    """Generations sent once /health is 200, before the thresholds are read: a fresh SGLang has no
    acceptance length until it has served a speculative decode step."""

    requests: int = Field(default=3, ge=1, le=100)
    """Generations sent."""
    max_tokens: int = Field(default=64, ge=1, le=4096)
    """Tokens asked of each generation."""
    prompt: str = "Explain speculative decoding in one paragraph."
    """The prompt sent."""
    path: str = "/generate"
    """The server path (``/generate`` or ``/v1/completions``)."""
    timeout: float = Field(default=120.0, gt=0)
    """Seconds the whole warm-up may take (every request together); a server that has not answered
    by then fails the gate."""


class Canary(_Strict):
    """Canary analysis on the warm-up's numbers: no worse than ``max_regression_percent`` below
    the release that ran before on this host, and above the absolute floors."""

    max_regression_percent: float | None = Field(default=None, ge=0, le=100)
    """How much worse than the release that ran before (acceptance length, decode tokens/s) is allowed."""
    min_accept_length: float | None = Field(default=None, ge=0)
    """The lowest speculative acceptance length allowed."""
    min_decode_tps: float | None = Field(default=None, ge=0)
    """The lowest decode tokens/s allowed."""


class Health(_Strict):
    path: str = "/health"
    """The path that must answer 200 after a restart."""
    timeout: float = Field(default=300.0, gt=0)
    """Seconds to wait for it (a model's load included)."""
    interval: float = Field(default=1.0, gt=0)
    """Seconds between two asks."""
    probes: list[ProbeGate] = Field(default_factory=list)
    """Probes of the installed release that must pass."""
    warmup: Warmup | None = None
    """Generations sent before the thresholds are read (needed by ``canary``)."""
    thresholds: list[Threshold] = Field(default_factory=list)
    """Bounds on fields of the server's JSON answers."""
    canary: Canary | None = None
    """The warm-up's numbers compared with the release that ran before on the host."""

    @model_validator(mode="after")
    def _canary_measures(self) -> Health:
        if self.canary is not None and self.warmup is None:
            raise ValueError("canary compares the warm-up's numbers: give health.warmup too")
        return self


def _check_template(key: str, text: str) -> None:
    from jinja2 import Environment, TemplateSyntaxError

    if "{{" in text or "{%" in text:
        try:
            Environment().parse(text)
        except TemplateSyntaxError as exc:
            raise ValueError(f"{key}: template error: {exc.message}") from None


def _port(value: Any) -> Any:
    """A port number, or a template of host variables (``"{{ base_port + 1 }}"``) rendered per host."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return value  # pydantic names the type error
    if isinstance(value, str) and not value.strip().isdigit():
        _check_template("port", value)
        return value
    port = int(value)
    if port > 65535:
        raise ValueError("Input should be less than or equal to 65535")
    if port < 1:
        raise ValueError("Input should be greater than or equal to 1")
    return port


class Instance(_Strict):
    """One of several servers of a release on each host (``tp4-a`` on GPUs 0-3, ``tp4-b`` on 4-7): its own
    unit ``sglang@NAME`` (or supervisor pidfile), port, GPUs, args (a flag given here replaces the
    service's same flag, the rest are added) and env; ``health`` replaces the spec's gates for it."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,40}$")
    """The instance's name (unit ``sglang@NAME``)."""
    port: int | str
    """Its port, or a template of host variables."""
    gpus: str | None = None
    """Its ``CUDA_VISIBLE_DEVICES`` (``"0,1,2,3"``)."""
    args: list[str] = Field(default_factory=list)
    """Launch args: a flag given here replaces the service's flag of that name, the rest are added."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment added to the service's (templates of host variables)."""
    health: Health | None = None
    """Its own gates, in place of the spec's ``health``."""

    @field_validator("port", mode="before")
    @classmethod
    def _port_valid(cls, value: Any) -> Any:
        return _port(value)

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        return {k: str(v) for k, v in value.items()} if isinstance(value, dict) else value

    @field_validator("env")
    @classmethod
    def _env_valid(cls, value: dict[str, str]) -> dict[str, str]:
        return _valid_env(value)


class Service(_Strict):
    module: str = "sglang.launch_server"
    """The Python module the server runs as (``python -m MODULE``)."""
    args: list[str] = Field(default_factory=list)
    """Launch args, each a Jinja2 template of the host's variables (``--tp, "{{ tp_size }}"``)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment, written to ``service.env`` (0600); values may be templates (``"{{ HF_TOKEN }}"``)."""
    host: str = "127.0.0.1"
    """The address the server listens on (host var ``service_host`` overrides it)."""
    port: int | str = 30000
    """The server's port, or a template (host var ``service_port`` overrides it)."""
    gpus: str | None = None
    """``CUDA_VISIBLE_DEVICES`` for the server, a template too."""
    manager: Literal["auto", "systemd", "process"] = "auto"
    """systemd units, fleetctl's supervisor (``process``), or whichever the host has (``auto``)."""
    stop_timeout: float = Field(default=30.0, gt=0)
    """Seconds a stopping server is given before it is killed."""
    standin: bool = False
    """Lab only: run fleetctl's stand-in SGLang server instead of the real one."""
    user: str | None = Field(default=None, pattern=r"^[a-z_][a-z0-9_-]*[$]?$", max_length=32)
    """The user the server runs as (systemd ``User=``; the supervisor drops to it); unset: the login user."""
    instances: list[Instance] = Field(default_factory=list)
    """Several servers per host, each with its own name, port, GPUs, args and env."""
    node_group: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Multi-node servers: the host variable whose value groups hosts into one server; templates then get
    ``nnodes``, ``node_rank`` and ``dist_init_addr``."""

    @field_validator("port", mode="before")
    @classmethod
    def _port_valid(cls, value: Any) -> Any:
        return _port(value)

    @model_validator(mode="after")
    def _instances_distinct(self) -> Service:
        names = [i.name for i in self.instances]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"instances: name {twice[0]!r} given twice")
        ports = [i.port for i in self.instances if isinstance(i.port, int)]
        same = sorted({p for p in ports if ports.count(p) > 1})
        if same:
            raise ValueError(f"instances: port {same[0]} given twice")
        return self

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: v if isinstance(v, str) else str(v) for k, v in value.items()}
        return value

    @field_validator("env")
    @classmethod
    def _env_valid(cls, value: dict[str, str]) -> dict[str, str]:
        return _valid_env(value)


def _valid_env(value: dict[str, str]) -> dict[str, str]:
    for key, text in value.items():
        if not key.isidentifier():
            raise ValueError(f"{key!r} is not an environment variable name")
        _check_template(key, text)
    return value


class Kernels(_Strict):
    dir: str | None = None
    """A folder of tuned Triton MoE configs (``triton_X_Y_Z/E=..,N=..,device_name=...json``)."""


class ReleaseModel(_Strict):
    name: str = Field(pattern=SLUG)
    """The release's name: the first part of its id ``<name>-<version>-<hash8>``."""
    version: str = Field(pattern=SLUG)
    """Its version: the second part of the id."""
    description: str = ""
    """Free text for people."""
    base: Base
    """Where the release's venv comes from."""
    requires: dict[str, str] = Field(default_factory=dict)
    """Distribution -> version specifier the base must satisfy (``sglang: "==0.5.23"``)."""
    patches: list[PatchRef] = Field(default_factory=list)
    """Patches applied to the release's copy of the base."""
    kernels: Kernels = Field(default_factory=Kernels)
    """Tuned kernel configs merged with SGLang's own."""
    service: Service = Field(default_factory=Service)
    """How the server runs."""
    health: Health = Field(default_factory=Health)
    """The gates after each restart; a failure switches the host back."""
    keep_releases: int = Field(default=3, ge=2)
    """Release folders kept on each host after a deploy (older ones pruned)."""
    models: Models = Field(default_factory=dict)
    """Role (``main``, ``draft``) -> the model it serves: checked on each host before the switch."""


@dataclass(frozen=True)
class PatchFile:
    path: Path
    distribution: str
    version: str


@dataclass(frozen=True)
class ReleaseSpec:
    path: Path
    model: ReleaseModel
    release_id: str
    patches: tuple[PatchFile, ...]
    digest: str
    base_lock_digest: str = ""  # sha256 of base.lock's file, names the base venv built from it

    @property
    def models(self) -> list[ModelRef]:
        """The models the release needs; their revisions are in the spec text, so in the release id."""
        return refs(self.model.models)


def load_spec(path: str | Path) -> ReleaseSpec:
    path = Path(path)
    doc = yamlfile.load(path, "release spec")
    model = yamlfile.validate(doc, ReleaseModel, "release spec")
    _check_requires(doc, model)
    patches = tuple(_patch_files(doc, model))
    lock_digest = ""
    if model.base.lock is not None:
        lock = _existing(doc, ("base", "lock"), path.parent / model.base.lock)
        lock_digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    if model.base.wheelhouse is not None and not (path.parent / model.base.wheelhouse).is_dir():
        folder = path.parent / model.base.wheelhouse
        raise doc.error(("base", "wheelhouse"), f"base.wheelhouse: no such folder {folder}")
    digest = _digest(path, patches, model)
    if lock_digest:  # the pinned set is part of what the release is
        digest = hashlib.sha256((digest + lock_digest).encode()).hexdigest()
    return ReleaseSpec(path, model, f"{model.name}-{model.version}-{digest[:8]}", patches, digest, lock_digest)


def _check_requires(doc: yamlfile.YamlDoc, model: ReleaseModel) -> None:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    for dist, spec in model.requires.items():
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            raise doc.error(("requires", dist), f"requires.{dist}: {spec!r} is not a version specifier") from None


def _patch_files(doc: yamlfile.YamlDoc, model: ReleaseModel) -> list[PatchFile]:
    base = doc.path.parent
    out: list[PatchFile] = []
    for i, ref in enumerate(model.patches):
        if ref.file is not None:
            out.append(PatchFile(_existing(doc, ("patches", i, "file"), base / ref.file), ref.distribution or "",
                                 ref.version or ""))
            continue
        series_path = _existing(doc, ("patches", i, "series"), base / (ref.series or ""))
        out.extend(_series(series_path))
    return out


def _series(path: Path) -> list[PatchFile]:
    doc = yamlfile.load(path, "patch series")
    items = doc.data.get("patches") if isinstance(doc.data, dict) else None
    if not isinstance(items, list):
        raise doc.error((), "a patch series is a mapping with a 'patches' list")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not {"file", "distribution", "version"} <= set(item):
            raise doc.error(("patches", i), f"patches.{i}: needs file, distribution and version")
        out.append(PatchFile(_existing(doc, ("patches", i, "file"), path.parent / str(item["file"])),
                             str(item["distribution"]), str(item["version"])))
    return out


def _existing(doc: yamlfile.YamlDoc, loc: tuple[Any, ...], path: Path) -> Path:
    if not path.is_file():
        raise doc.error(loc, f"{'.'.join(map(str, loc))}: no such file {path}")
    return path


def _digest(path: Path, patches: tuple[PatchFile, ...], model: ReleaseModel) -> str:
    h = hashlib.sha256(path.read_bytes())
    for patch in patches:
        h.update(patch.path.read_bytes())
    kernel_dir = path.parent / model.kernels.dir if model.kernels.dir else None
    if kernel_dir and kernel_dir.is_dir():
        for f in sorted(kernel_dir.rglob("*.json")):
            h.update(str(f.relative_to(kernel_dir)).encode() + f.read_bytes())
    return h.hexdigest()
