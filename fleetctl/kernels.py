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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fleetctl.errors import InputError
from fleetctl.facts import collect_gpu, venv_python
from fleetctl.gpu.smi import GpuFacts, sglang_device_name
from fleetctl.transport.base import HostSession

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


@dataclass
class KernelHost:
    """What decides a host's configs: GPU name, triton version, the installed SGLang's built-ins."""

    venv: str | None
    gpu_names: list[str]
    gpu_source: str
    triton_version: str | None
    triton_source: str
    sglang_version: str | None = None
    builtin_dir: str | None = None
    builtin: dict[str, list[str]] = field(default_factory=dict)  # triton folder -> file names
    fixed_order: list[str] | None = None

    @property
    def device_names(self) -> list[str]:
        return [sglang_device_name(n) for n in self.gpu_names]

    @property
    def triton_folder(self) -> str | None:
        return triton_folder(self.triton_version) if self.triton_version else None


def resolve_gpu(gpus: GpuFacts, host_vars: Mapping[str, Any]) -> tuple[list[str], str]:
    """GPU names from nvidia-smi; the host var ``gpu_name`` stands in where it gives none."""
    names = sorted({g.name for g in gpus.gpus})
    var = host_vars.get("gpu_name")
    if names:
        ignored = f"; host var gpu_name={var!r} ignored" if var and str(var) not in names else ""
        return names, f"nvidia-smi{ignored}"
    why = "nvidia-smi not found" if gpus.nvidia_smi is None else (gpus.error or "nvidia-smi listed no GPU")
    return ([str(var)], f"host var gpu_name: {why}") if var else ([], why)


def resolve_triton(raw: Mapping[str, Any] | None, host_vars: Mapping[str, Any], where: str) -> tuple[str | None, str]:
    """The venv's triton version; the host var ``triton_version`` stands in where triton is not installed."""
    var = host_vars.get("triton_version")
    if raw and raw.get("version"):
        version = str(raw["version"])
        ignored = f"; host var triton_version={var!r} ignored" if var and str(var) != version else ""
        return version, f"{where}{ignored}"
    if var:
        return str(var), f"host var triton_version: triton not installed in {where}"
    return None, f"triton not installed in {where}"


def gather(session: HostSession, venv: str | None, contents: bool = False,
           texts_named: Collection[str] = ()) -> tuple[KernelHost, dict[str, str]]:
    """Ask one host (its nvidia-smi, and ``venv``'s python) and return its KernelHost, plus the text of
    every built-in config (``triton_X_Y_Z/name`` -> text) when ``contents``, else of those whose
    name is in ``texts_named``."""
    gpus = collect_gpu(session, health=False)
    answer = session.call("kernel_configs", {"op": "inspect", "contents": contents, "texts_named": sorted(texts_named)},
                          python=venv_python(venv) if venv else None)
    where = venv or f"the agent's python {answer.get('python')}"
    names, gpu_source = resolve_gpu(gpus, session.vars)
    version, triton_source = resolve_triton(answer.get("triton"), session.vars, where)
    sglang = answer.get("sglang") or {}
    host = KernelHost(venv, names, gpu_source, version, triton_source, sglang.get("version"),
                      sglang.get("configs_dir"), dict(sglang.get("folders") or {}), sglang.get("fallback_order"))
    return host, dict(sglang.get("files") or {})


# --- the plan -----------------------------------------------------------------------------------------


@dataclass
class PlanEntry:
    """One tuned config name for this host's GPU, and what SGLang would load for it."""

    filename: str
    tuned_in: list[str]  # triton folders holding a tuned file of this name
    loads: str | None  # the folder SGLang loads it from (None: unknown triton, or nothing)
    status: str  # exact | fallback | shadowed (another file found first) | unused (never found) | unknown


@dataclass
class KernelPlan:
    host: str
    facts: KernelHost
    selected: list[str] = field(default_factory=list)  # tuned files shipped: triton_X_Y_Z/name
    entries: list[PlanEntry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # tuned files this host's SGLang would reject

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["device_names"] = self.facts.device_names
        out["triton_folder"] = self.facts.triton_folder
        return out


def plan_host(host: str, facts: KernelHost, tuned: TunedSet,
              builtin_texts: Mapping[str, str] | None = None) -> KernelPlan:
    """Which tuned files apply on this host and what SGLang would load for each; warnings where it
    would fall back to another triton folder or find no tuned file for the GPU. ``builtin_texts``
    (``triton_X_Y_Z/name`` -> text, at least of ``sibling_names(tuned)``) lets the up/down check of
    older SGLang compare a tuned file with the built-in one it is paired with."""
    selected = tuned.for_devices(facts.device_names)
    plan = KernelPlan(host, facts, [f.rel for f in selected])
    folders: dict[str, set[str]] = {k: set(v) for k, v in facts.builtin.items()}
    for f in selected:
        folders.setdefault(f.folder, set()).add(f.filename)
    by_name: dict[str, list[str]] = {}
    for f in selected:
        by_name.setdefault(f.filename, []).append(f.folder)
    for filename, tuned_in in sorted(by_name.items()):
        plan.entries.append(_entry(filename, sorted(tuned_in), facts, folders))
    plan.warnings = _host_warnings(facts, tuned, bool(selected), folders) + [
        w for e in plan.entries if (w := _entry_warning(e, facts))] + [
        w for f in selected if (w := launch_key_warning(f.rel, f.text))]
    if facts.builtin_dir is None:
        plan.notes.append(f"sglang not found in {facts.venv or 'the agent python'}: SGLang's built-in configs "
                          "are unknown, this plan covers the tuned files only")
    plan.notes += _down_notes(selected, folders)
    plan.refusals = _down_refusals(selected, facts, folders, builtin_texts or {})
    return plan


def _down_sibling(f: TunedFile) -> str:
    return replace(f.name, down=not f.name.down).filename()


def _down_notes(selected: Sequence[TunedFile], folders: Mapping[str, set[str]]) -> list[str]:
    """SGLang (0.5.23) runs the down projection with the up config when no ``_down`` file exists."""
    return [f"{f.rel}: no {_down_sibling(f)} in {f.folder}: the down projection uses this (up) config"
            for f in selected if not f.name.down and _down_sibling(f) not in folders.get(f.folder, set())]


def sibling_names(tuned: TunedSet) -> set[str]:
    """The up/down partners of every tuned file: the built-in ones the up/down check may compare."""
    return {_down_sibling(f) for f in tuned.files}


def _asserts_block_m(sglang_version: str | None) -> bool:
    """SGLang before 0.5.23 (0.5.9) asserts that the up and down configs agree on BLOCK_SIZE_M."""
    from packaging.version import InvalidVersion, Version

    try:
        return sglang_version is not None and Version(sglang_version) < Version("0.5.23")
    except InvalidVersion:
        return False


def _down_refusals(selected: Sequence[TunedFile], facts: KernelHost, folders: Mapping[str, set[str]],
                   builtin_texts: Mapping[str, str]) -> list[str]:
    """Older SGLang picks, for a batch of M tokens, the up config nearest M and the ``_down`` config
    nearest M (each from the folder its lookup finds, tuned or built-in) and asserts their
    BLOCK_SIZE_M agree: a tuned file in a pair that disagrees would stop the server."""
    if not _asserts_block_m(facts.sglang_version) or facts.triton_version is None:
        return []
    texts = {**builtin_texts, **{f.rel: f.text for f in selected}}
    tuned = {f.rel for f in selected}
    out = []
    for down in sorted({f.filename if f.name.down else _down_sibling(f) for f in selected}):
        up = down[: -len("_down.json")] + ".json"
        at = [sglang_lookup(n, facts.triton_version, folders, facts.fixed_order) for n in (up, down)]
        if at[0] is None or at[1] is None:
            continue  # no up file: SGLang's default config; no down file: nothing to agree with
        up_rel, down_rel = f"{at[0]}/{up}", f"{at[1]}/{down}"
        if not {up_rel, down_rel} & tuned or up_rel not in texts or down_rel not in texts:
            continue  # SGLang's own pair, or a built-in text this plan was not given
        bad = _disagreeing_batches(json.loads(texts[up_rel]), json.loads(texts[down_rel]))
        if bad:
            kind = {r: "tuned" if r in tuned else "built-in" for r in (up_rel, down_rel)}
            out.append(f"{down_rel} ({kind[down_rel]}): BLOCK_SIZE_M differs from {up_rel} ({kind[up_rel]}) for "
                       f"batch size {', '.join(map(str, bad[:5]))}{'...' if len(bad) > 5 else ''}: sglang "
                       f"{facts.sglang_version} asserts they agree (0.5.23 and later do not)")
    return out


def _disagreeing_batches(up: Mapping[str, Any], down: Mapping[str, Any]) -> list[int]:
    """The batch sizes M (those the files name, else any up to the largest) where the up entry
    nearest M and the down entry nearest M (SGLang's ``min(keys, key=abs(k - M))``) differ."""
    up_keys, down_keys = [int(k) for k in up], [int(k) for k in down]

    def differ(m: int) -> bool:
        u, d = min(up_keys, key=lambda k: abs(k - m)), min(down_keys, key=lambda k: abs(k - m))
        return bool(up[str(u)].get("BLOCK_SIZE_M") != down[str(d)].get("BLOCK_SIZE_M"))

    named = sorted(set(up_keys) | set(down_keys))
    return [m for m in named if differ(m)] or [m for m in range(1, named[-1] + 1) if differ(m)]


def _entry(filename: str, tuned_in: list[str], facts: KernelHost, folders: Mapping[str, set[str]]) -> PlanEntry:
    if facts.triton_version is None:
        return PlanEntry(filename, tuned_in, None, "unknown")
    loads = sglang_lookup(filename, facts.triton_version, folders, facts.fixed_order)
    if loads is None:
        return PlanEntry(filename, tuned_in, None, "unused")
    if loads not in tuned_in:
        return PlanEntry(filename, tuned_in, loads, "shadowed")
    return PlanEntry(filename, tuned_in, loads, "exact" if loads == facts.triton_folder else "fallback")


def _entry_warning(entry: PlanEntry, facts: KernelHost) -> str | None:
    if entry.status == "fallback":
        return (f"{entry.filename}: not in {facts.triton_folder} (the host's triton {facts.triton_version}): "
                f"SGLang falls back to {entry.loads}, performance might be sub-optimal")
    if entry.status == "shadowed":
        return (f"{entry.filename}: tuned in {', '.join(entry.tuned_in)} but SGLang loads the built-in "
                f"{entry.loads} file first (triton {facts.triton_version})")
    if entry.status == "unused":
        return (f"{entry.filename}: SGLang {facts.sglang_version} never looks in {', '.join(entry.tuned_in)} "
                f"(it tries triton {', '.join(facts.fixed_order or [])}): default config, sub-optimal")
    return None


def _host_warnings(facts: KernelHost, tuned: TunedSet, any_selected: bool,
                   folders: Mapping[str, set[str]]) -> list[str]:
    out = []
    if not facts.gpu_names:
        out.append(f"no GPU name ({facts.gpu_source}): set the host var gpu_name; no tuned config selected")
    elif len(facts.gpu_names) > 1:
        out.append(f"GPU models differ on this host ({', '.join(facts.gpu_names)}): every rank names its config "
                   f"by cuda:0's GPU ({facts.gpu_names[0]}), so the others run a config tuned for another GPU")
    if facts.triton_version is None:
        out.append(f"no triton version ({facts.triton_source}): set the host var triton_version")
    for device in facts.device_names if not any_selected else []:
        out.append(f"no tuned config for {device} in {tuned.root}: SGLang uses its built-in one if any, "
                   "else its default config (sub-optimal)")
    if facts.triton_folder and (facts.builtin_dir or any_selected) and facts.triton_folder not in folders:
        others = sorted((f for f in folders if _FOLDER_RE.match(f)), key=folder_version, reverse=True)
        out.append(f"no {facts.triton_folder} folder at all (built-in or tuned): SGLang falls back to the newest "
                   f"other triton folder holding each config ({', '.join(others[:3]) or 'none'}...), performance "
                   "might be sub-optimal")
    return out


# --- collect ------------------------------------------------------------------------------------------


@dataclass
class Collected:
    """A tuning run's output on one host, with the triton version that names its folder."""

    host: str
    src: str
    triton_version: str | None
    triton_source: str
    gpu_names: list[str]
    gpu_source: str
    exists: bool
    files: dict[str, str]  # file name -> text (SGLang-named configs only)
    skipped: list[str] = field(default_factory=list)  # other *.json files in src, and unreadable ones


@dataclass
class CollectItem:
    filename: str
    target: str  # triton_X_Y_Z/name under the destination
    action: str  # added | unchanged | overwritten | differs (refused: --force)
    note: str = ""


def fetch_tuning_output(session: HostSession, src: str, venv: str | None) -> Collected:
    names, gpu_source = resolve_gpu(collect_gpu(session, health=False), session.vars)
    answer = session.call("kernel_configs", {"op": "collect", "src": src}, python=venv_python(venv) if venv else None)
    version, source = resolve_triton(answer.get("triton"), session.vars, venv or f"the agent's python "
                                                                             f"{answer.get('python')}")
    files = {n: t for n, t in answer["files"].items() if n.startswith("E=")}
    skipped = sorted(set(answer["files"]) - set(files)) + [f"{n} (unreadable)" for n in answer["unreadable"]]
    skipped += [f"{n} (a symlink: refused)" for n in answer.get("links") or []]
    return Collected(session.name, src, version, source, names, gpu_source, bool(answer.get("exists")), files,
                     skipped)


def plan_collect(got: Collected, dest: Path, force: bool) -> list[CollectItem]:
    """Validate every file (the first problem raises, naming the file and key) and decide what to write."""
    if not got.exists or not got.files:
        what = "no such folder" if not got.exists else f"no E=*.json config in it (other: {got.skipped or 'none'})"
        raise InputError(f"{got.host}:{got.src}: {what}")
    if got.triton_version is None:
        raise InputError(f"{got.host}: {got.triton_source}: cannot name the triton folder; set the host var "
                         "triton_version")
    folder = triton_folder(got.triton_version)
    if not _FOLDER_RE.match(folder):  # the version came from the host: it must not name a path
        raise InputError(f"{got.host}: triton version {got.triton_version!r} ({got.triton_source}) does not name "
                         "a triton_X_Y_Z folder")
    devices = {sglang_device_name(n) for n in got.gpu_names}
    items = []
    for filename, text in sorted(got.files.items()):
        where = f"{got.host}:{got.src}/{filename}"
        name = parse_config_name(filename, where)
        path = dest / folder / filename
        if "/" in filename or "\\" in filename or filename.startswith(".") or \
                not path.resolve().is_relative_to((dest / folder).resolve()):
            raise InputError(f"{where}: refused: the name leaves {dest / folder}")
        validate_config(text, where)
        action = "added"
        if path.exists():
            same = path.read_text(encoding="utf-8") == text
            action = "unchanged" if same else "overwritten" if force else "differs"
        notes = [] if not devices or name.device_name in devices else [
            f"tuned for {name.device_name}, {got.host} has {', '.join(sorted(devices))}"]
        short = launch_key_warning(filename, text)
        notes += [short.split(": ", 1)[1]] if short else []
        items.append(CollectItem(filename, f"{folder}/{filename}", action, "; ".join(notes)))
    return items


def write_collected(got: Collected, items: Sequence[CollectItem], dest: Path) -> None:
    for item in items:
        if item.action in ("added", "overwritten"):
            path = dest / item.target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(got.files[item.filename], encoding="utf-8")
