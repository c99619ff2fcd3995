"""``fleetctl kernels collect``: a host's tuning output fetched, checked and written under the tuned folder."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fleetctl.errors import InputError
from fleetctl.facts import venv_python
from fleetctl.gpu.collect import collect_gpu
from fleetctl.gpu.smi import sglang_device_name
from fleetctl.kernels.configs import _FOLDER_RE, launch_key_warning, parse_config_name, triton_folder, validate_config
from fleetctl.kernels.plan import resolve_gpu, resolve_triton
from fleetctl.transport.base import HostSession


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
