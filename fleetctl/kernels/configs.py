"""Tuned fused-MoE Triton configs: validation, SGLang's naming and lookup, selection per host, and the
merged config folder a release ships. Pure, except ``gather`` and ``fetch_tuning_output`` (one host).

SGLang (``fused_moe_triton_config.py``) loads ``<dir>/configs/triton_<X_Y_Z>/<name>`` where ``<dir>``
is ``$SGLANG_MOE_CONFIG_DIR`` or its own package folder, ``X_Y_Z`` is ``triton.__version__`` with dots
as underscores and ``<name>`` is ``E=..,N=..,device_name=<GPU name, spaces -> _>[,dtype=..]
[,block_shape=[n, k]][,per_channel_quant=True][_down].json``. With no such file it falls back to the
newest other ``triton_*`` folder holding that name ("performance might be sub-optimal"). Setting the
variable REPLACES the built-in folder, so a release ships the built-in configs merged with the tuned.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.errors import InputError

ENV_VAR = "SGLANG_MOE_CONFIG_DIR"
REQUIRED_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")
# SGLang loads a config without these (it ships seven such files; Triton's defaults apply): warn.
LAUNCH_KEYS = ("num_warps", "num_stages")
# Keys SGLang's own configs also carry (TMA on Hopper+, ROCm tuning, clusters); anything else is a typo.
OPTIONAL_KEYS: dict[str, type] = {"USE_TMA": bool, "num_ctas": int, "kpack": int, "matrix_instr_nonkdim": int,
                                  "waves_per_eu": int}
_NAME_RE = re.compile(
    r"^E=(?P<e>\d+),N=(?P<n>\d+),device_name=(?P<device>[^, ]*?)(?:,dtype=(?P<dtype>[A-Za-z0-9_]+?))?"
    r"(?:,block_shape=\[(?P<bn>\d+), (?P<bk>\d+)\])?(?P<pcq>,per_channel_quant=True)?(?P<down>_down)?\.json$")
_FOLDER_RE = re.compile(r"^triton_\d+(?:_\d+)*$")


class KernelConfigError(InputError):
    """A tuned config file is misnamed, misplaced or malformed; the message names the file and key."""


@dataclass(frozen=True, order=True)
class ConfigName:
    """The parts of SGLang's config file name (``get_config_file_name``)."""

    experts: int
    n: int
    device_name: str
    dtype: str | None = None
    block_shape: tuple[int, int] | None = None
    per_channel_quant: bool = False
    down: bool = False

    def filename(self) -> str:
        block = f",block_shape=[{self.block_shape[0]}, {self.block_shape[1]}]" if self.block_shape else ""
        return (f"E={self.experts},N={self.n},device_name={self.device_name}"
                f"{f',dtype={self.dtype}' if self.dtype else ''}{block}"
                f"{',per_channel_quant=True' if self.per_channel_quant else ''}{'_down' if self.down else ''}.json")


def parse_config_name(filename: str, where: str | None = None) -> ConfigName:
    """``E=..,N=..,device_name=..`` -> ConfigName; a name SGLang would never ask for is an error."""
    m = _NAME_RE.match(filename)
    name = None
    if m:
        block = (int(m["bn"]), int(m["bk"])) if m["bn"] else None
        name = ConfigName(int(m["e"]), int(m["n"]), m["device"], m["dtype"], block, bool(m["pcq"]), bool(m["down"]))
    if name is None or name.filename() != filename:
        raise KernelConfigError(f"{where or filename}: not an SGLang fused-MoE config name (expected "
                                "E=<n>,N=<n>,device_name=<GPU>[,dtype=..][,block_shape=[n, k]]"
                                "[,per_channel_quant=True][_down].json)")
    return name


def triton_folder(version: str) -> str:
    """The folder SGLang looks in for a triton version: "3.4.0" -> "triton_3_4_0"."""
    return "triton_" + version.replace(".", "_")


def folder_version(folder: str) -> tuple[int, ...]:
    return tuple(int(x) for x in folder.removeprefix("triton_").split("_"))


def validate_config(text: str, where: str) -> dict[str, dict[str, Any]]:
    """A config's content: ``{"<batch size>": {BLOCK_SIZE_M.., num_warps, num_stages}}``, checked."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise KernelConfigError(f"{where}: not valid JSON: {exc}") from None
    except RecursionError:
        raise KernelConfigError(f"{where}: not valid JSON: nested too deeply") from None
    if not isinstance(data, dict) or not data:
        raise KernelConfigError(f"{where}: expected a non-empty object of batch sizes")
    for batch, entry in data.items():
        if not batch.isdigit() or int(batch) < 1:
            raise KernelConfigError(f"{where}: key {batch!r}: not a batch size (a positive integer)")
        _check_entry(entry, f"{where}: key {batch!r}")
    return data


def _check_entry(entry: Any, where: str) -> None:
    if not isinstance(entry, dict):
        raise KernelConfigError(f"{where}: expected an object of kernel parameters")
    missing = [k for k in REQUIRED_KEYS if k not in entry]
    if missing:
        raise KernelConfigError(f"{where}: missing {', '.join(missing)}")
    for key, value in entry.items():
        kind = int if key in (*REQUIRED_KEYS, *LAUNCH_KEYS) else OPTIONAL_KEYS.get(key)
        if kind is None:
            raise KernelConfigError(f"{where}: unknown parameter {key!r} (known: "
                                    f"{', '.join([*REQUIRED_KEYS, *LAUNCH_KEYS, *OPTIONAL_KEYS])})")
        least = 1 if key in (*REQUIRED_KEYS, *LAUNCH_KEYS) else 0  # ROCm's waves_per_eu is 0 in SGLang's own
        if not (isinstance(value, bool) if kind is bool else (type(value) is int and value >= least)):
            want = "true or false" if kind is bool else "a positive integer" if least else "an integer >= 0"
            raise KernelConfigError(f"{where}: {key} is {value!r}, expected {want}")


def launch_key_warning(name: str, text: str) -> str | None:
    """A warning for a config whose batches lack num_warps/num_stages (valid text assumed)."""
    data = json.loads(text)
    short = sorted((b for b, e in data.items() if any(k not in e for k in LAUNCH_KEYS)), key=int)
    if not short:
        return None
    return (f"{name}: batch size {', '.join(short[:5])}{'...' if len(short) > 5 else ''} has no "
            f"{'/'.join(LAUNCH_KEYS)}: SGLang loads it with Triton's defaults (as some of its own configs)")


@dataclass(frozen=True)
class TunedFile:
    folder: str  # triton_X_Y_Z
    name: ConfigName
    text: str

    @property
    def filename(self) -> str:
        return self.name.filename()

    @property
    def rel(self) -> str:
        return f"{self.folder}/{self.filename}"


@dataclass
class TunedSet:
    """The tuned configs of one folder (``playbooks/files/kernels``), all valid."""

    root: Path
    files: list[TunedFile]
    readme: str | None = None  # the README's first line: says whether these are samples

    def for_devices(self, devices: Collection[str]) -> list[TunedFile]:
        return [f for f in self.files if f.name.device_name in devices]

    def summary(self) -> str:
        devices = sorted({f.name.device_name for f in self.files})
        folders = sorted({f.folder for f in self.files})
        line = (f"{self.root}: {len(self.files)} tuned files for {', '.join(devices) or 'no GPU'} "
                f"in {', '.join(folders) or 'no triton folder'}")
        return line + (f" (README: {self.readme})" if self.readme else "")


def load_tuned(root: Path) -> TunedSet:
    """Every ``triton_X_Y_Z/*.json`` under ``root``, validated; a JSON file anywhere else is an error."""
    if not root.is_dir():
        raise KernelConfigError(f"{root}: no such folder of tuned kernel configs")
    files = []
    for path in sorted(root.rglob("*.json")):
        rel = path.relative_to(root)
        if len(rel.parts) != 2 or not _FOLDER_RE.match(rel.parts[0]):
            raise KernelConfigError(f"{path}: tuned configs go in {root}/triton_X_Y_Z/ (the triton version "
                                    "they were tuned with)")
        name = parse_config_name(path.name, str(path))
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise KernelConfigError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                                    f"{exc.start})") from None
        validate_config(text, str(path))
        files.append(TunedFile(rel.parts[0], name, text))
    readme = root / "README.md"
    first = readme.read_text(encoding="utf-8").strip().splitlines()[0].lstrip("# ") if readme.is_file() else None
    return TunedSet(root, files, first or None)


def sglang_lookup(filename: str, triton_version: str, folders: Mapping[str, Collection[str]],
                  fixed_order: Sequence[str] | None = None) -> str | None:
    """The folder SGLang loads ``filename`` from: the exact triton folder, else the newest other folder
    holding it (older SGLang: the first of its fixed version list). None: no file, default config."""
    exact = triton_folder(triton_version)
    if filename in folders.get(exact, ()):
        return exact
    if fixed_order is not None:
        order = [triton_folder(v) for v in fixed_order if v != triton_version]
    else:
        order = sorted((f for f in folders if f != exact and _FOLDER_RE.match(f)), key=folder_version, reverse=True)
    return next((f for f in order if filename in folders.get(f, ())), None)


def merged_folder(builtin: Mapping[str, str], tuned: Sequence[TunedFile]) -> tuple[dict[str, str], list[str]]:
    """The release's ``configs/`` files (``triton_X_Y_Z/name`` -> text): built-in, then tuned over them.
    Also the built-in files a tuned one replaced (same folder and name, other content)."""
    files = dict(builtin)
    replaced = [f.rel for f in tuned if f.rel in builtin and builtin[f.rel] != f.text]
    files.update({f.rel: f.text for f in tuned})
    return files, sorted(replaced)


# --- one host ---------------------------------------------------------------------------------------------
