"""The run journal: one JSON-lines file per run under ``.fleetctl/runs/`` beside the inventory.

Every event (run start, batch, task start/result per host, rollback, interruption, end) is one
line, flushed and fsynced as it happens, so a killed controller leaves a journal that says where
it stopped and ``--resume`` can skip the hosts that finished. Secret values never reach it: each
event passes through a ``secrets.Redactor`` holding every value of a variable named in ``secret_vars``.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.errors import InputError
from fleetctl.secrets import Redactor

_RUN_ID = re.compile(r"^[0-9]{8}-[0-9]{6}(-[0-9]+)?-[A-Za-z0-9_.-]+$")


def runs_dir(inventory_folder: Path) -> Path:
    return inventory_folder.resolve() / ".fleetctl" / "runs"


class Journal:
    def __init__(self, path: Path, redact: Redactor) -> None:
        self.path = path
        self.run_id = path.stem
        self.redact = redact
        self._lock = threading.Lock()
        self._file = path.open("a", encoding="utf-8")
        self.tee: Callable[[str], None] | None = None  # each line also goes here (run --events)

    @classmethod
    def create(cls, folder: Path, playbook: Path, redact: Redactor) -> Journal:
        folder.mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", playbook.stem) or "playbook"
        base = f"{time.strftime('%Y%m%d-%H%M%S')}"
        for n in range(1000):
            path = folder / (f"{base}-{stem}.jsonl" if n == 0 else f"{base}-{n}-{stem}.jsonl")
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                return cls(path, redact)
            except FileExistsError:
                continue
        raise InputError(f"{folder}: cannot create a run journal")

    @classmethod
    def reopen(cls, folder: Path, run_id: str, redact: Redactor) -> Journal:
        return cls(find_run(folder, run_id), redact)

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one event; returns its fields as written (secrets masked)."""
        shown: dict[str, Any] = self.redact(fields)
        line = json.dumps({"ts": round(time.time(), 3), "event": kind, **shown}, default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
            if self.tee is not None:
                self.tee(line)
        return shown

    def close(self) -> None:
        self._file.close()


def find_run(folder: Path, run_id: str) -> Path:
    name = run_id[:-6] if run_id.endswith(".jsonl") else run_id
    if not _RUN_ID.match(name):
        raise InputError(f"{run_id!r} is not a run id (see `fleetctl runs list`)")
    path = folder / f"{name}.jsonl"
    if not path.is_file():
        raise InputError(f"no run {name} in {folder} (see `fleetctl runs list`)")
    return path


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every event; a last line cut short by a killed controller is ignored."""
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            events.append(doc)
    return events


@dataclass
class RunSummary:
    run_id: str
    playbook: str
    started: float | None
    ended: float | None
    status: str  # ok | failed | halted | interrupted | incomplete
    check: bool
    hosts: list[str] = field(default_factory=list)
    recap: dict[str, dict[str, int]] = field(default_factory=dict)
    stopped: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def summarize(path: Path) -> RunSummary:
    events = read_events(path)
    start = next((e for e in events if e.get("event") == "run_start"), {})
    end = next((e for e in reversed(events) if e.get("event") == "run_end"), None)
    stop = next((e for e in reversed(events) if e.get("event") in ("halted", "interrupted")), None)
    hosts = sorted({e["host"] for e in events if isinstance(e.get("host"), str)})
    status = "incomplete" if end is None else str(end.get("status", "?"))
    return RunSummary(path.stem, str(start.get("playbook", "?")), start.get("ts"), end.get("ts") if end else None,
                      status, bool(start.get("check")), hosts, dict(end.get("recap", {})) if end else {}, stop)


def list_runs(folder: Path) -> list[RunSummary]:
    return [summarize(p) for p in sorted(folder.glob("*.jsonl"))] if folder.is_dir() else []


def finished_hosts(events: Iterable[Mapping[str, Any]]) -> dict[int, set[str]]:
    """Per play index: hosts that went through every task of the play, and were not rolled back since."""
    done: dict[int, set[str]] = {}
    for e in events:
        kind, play, host = e.get("event"), e.get("play"), e.get("host")
        if not isinstance(play, int) or not isinstance(host, str):
            continue
        if kind == "host_done" and e.get("status") == "ok":
            done.setdefault(play, set()).add(host)
        elif kind in ("host_done", "rollback"):
            done.get(play, set()).discard(host)
    return done


def recorded_releases(events: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, str | None]]:
    """Per play index: the release each host ran before the rollout first started (the oldest record)."""
    out: dict[int, dict[str, str | None]] = {}
    for e in events:
        if e.get("event") == "recorded" and isinstance(e.get("play"), int):
            for host, rid in dict(e.get("releases") or {}).items():
                out.setdefault(e["play"], {}).setdefault(host, rid)
    return out
