"""Which tuned configs each host gets: its GPU and Triton, the plan per file, and the warnings and refusals
SGLang's lookup calls for. Pure, except ``gather`` (one host)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from fleetctl.facts import venv_python
from fleetctl.gpu.collect import collect_gpu
from fleetctl.gpu.smi import GpuFacts, sglang_device_name
from fleetctl.kernels.configs import (
    _FOLDER_RE,
    TunedFile,
    TunedSet,
    folder_version,
    launch_key_warning,
    sglang_lookup,
    triton_folder,
)
from fleetctl.transport.base import HostSession


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
