"""The report's view of the run journals (``.fleetctl/runs/`` beside the inventory): the last rollouts
(batches, durations, failures, rollbacks, the canary's gate numbers) and, per host, the last run that
touched it and what that run did to it. Pure functions of the journals' events; reading the files is
``journal.read_events``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.runs import journal

# What a run did to one host, the one kept first: a host that failed and was then rolled back is
# "rolled back" (the run undid its change), one that failed and stayed so is "failed".
HOST_RESULTS = ("unreachable", "rolled back", "failed", "incomplete", "changed", "ok")


@dataclass
class Batch:
    play: int
    batch: int
    batches: int
    hosts: list[str]
    started: float | None
    seconds: float | None  # None: the batch never ended (the run was killed in it)
    failed: list[str]


@dataclass
class RunView:
    run_id: str
    playbook: str
    status: str  # ok | failed | halted | interrupted | incomplete
    check: bool
    started: float | None
    seconds: float | None
    hosts: dict[str, str]  # host -> one of HOST_RESULTS
    batches: list[Batch] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)  # host, task, status, msg
    rollbacks: list[dict[str, Any]] = field(default_factory=list)  # host, to, status, msg, by
    canary: list[dict[str, Any]] = field(default_factory=list)  # host, gate, ok, detail (batch 1's release gates)
    halted: str | None = None  # why the run stopped early
    touched: dict[str, float] = field(default_factory=dict)  # host -> when the run last did something to it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def view(run_id: str, events: Sequence[Mapping[str, Any]]) -> RunView:
    start = next((e for e in events if e.get("event") in ("run_start", "resume")), {})
    end = next((e for e in reversed(events) if e.get("event") == "run_end"), None)
    stop = next((e for e in reversed(events) if e.get("event") in ("halted", "interrupted")), None)
    began, ended = _num(start.get("ts")), _num(end.get("ts")) if end else None
    run = RunView(run_id, str(start.get("playbook", "?")), "incomplete" if end is None else str(end.get("status", "?")),
                  bool(start.get("check")), began, ended - began if began is not None and ended is not None else None,
                  {}, halted=_why(stop))
    opened: dict[tuple[Any, Any], Batch] = {}
    for e in events:
        kind = e.get("event")
        _touch(run, e)
        if kind == "batch_start":
            b = Batch(_int(e.get("play")), _int(e.get("batch")), _int(e.get("batches")), _strs(e.get("hosts")),
                      _num(e.get("ts")), None, [])
            opened[(e.get("play"), e.get("batch"))] = b
            run.batches.append(b)
        elif kind == "batch_end" and (b2 := opened.get((e.get("play"), e.get("batch")))) is not None:
            ts = _num(e.get("ts"))
            b2.seconds = ts - b2.started if ts is not None and b2.started is not None else None
            b2.failed = _strs(e.get("failed"))
        elif kind == "task_result":
            _task_result(run, e)
        elif kind == "rollback":
            for host in _strs(e.get("hosts")) or ([str(e["host"])] if isinstance(e.get("host"), str) else []):
                run.rollbacks.append({"host": host, "to": e.get("to"), "status": str(e.get("status", "?")),
                                      "msg": str(e.get("msg", "")), "by": "rollout (on_failure)"})
                if e.get("status") == "rolled-back":
                    _mark(run.hosts, host, "rolled back")
        elif kind == "host_done" and isinstance(e.get("host"), str):
            _mark(run.hosts, e["host"], "failed" if e.get("status") == "failed" else "ok")
    for host in {h for b in run.batches for h in b.hosts} - set(run.hosts):
        run.hosts[host] = "incomplete"  # started, never finished (a killed controller)
    return run


def _touch(run: RunView, e: Mapping[str, Any]) -> None:
    """When the run last acted on each host an event names (overlapping runs: the later act wins)."""
    ts = _num(e.get("ts"))
    if ts is None or e.get("event") not in ("batch_start", "task_start", "task_result", "host_done", "rollback"):
        return
    named = _strs(e.get("hosts")) + ([e["host"]] if isinstance(e.get("host"), str) else [])
    for host in named:
        run.touched[host] = max(ts, run.touched.get(host, ts))


def _task_result(run: RunView, e: Mapping[str, Any]) -> None:
    host, status = str(e.get("host", "?")), str(e.get("status", "?"))
    if status in ("failed", "unreachable"):
        run.failures.append({"host": host, "task": str(e.get("name", "?")), "status": status,
                             "msg": str(e.get("msg", ""))})
        _mark(run.hosts, host, status)
    elif e.get("changed"):
        _mark(run.hosts, host, "changed")
    if e.get("rolled_back"):
        run.rollbacks.append({"host": host, "to": e.get("release"), "status": "rolled-back",
                              "msg": str(e.get("msg", "")), "by": "the release task (its health gate)"})
        _mark(run.hosts, host, "rolled back")
    data = e.get("data")
    first = run.batches[0] if run.batches else None
    if isinstance(data, dict) and first is not None and host in first.hosts and isinstance(data.get("gates"), list):
        for g in data["gates"]:
            if isinstance(g, dict):
                run.canary.append({"host": host, "gate": str(g.get("name", "?")), "ok": bool(g.get("ok")),
                                   "detail": str(g.get("detail", "")), "seconds": _num(g.get("seconds"))})


def _mark(hosts: dict[str, str], host: str, result: str) -> None:
    """Keep the worst of what the run did to the host (ok < changed < ... < unreachable)."""
    held = hosts.get(host)
    if held is None or HOST_RESULTS.index(result) < HOST_RESULTS.index(held):
        hosts[host] = result


def last_runs(folder: Path, limit: int = 5, hosts: Iterable[str] | None = None) -> list[RunView]:
    """The newest ``limit`` runs (that touched one of ``hosts``, when given), newest first: run ids
    start with their start time."""
    wanted = set(hosts) if hosts is not None else None
    out: list[RunView] = []
    for path in sorted(folder.glob("*.jsonl"), reverse=True) if folder.is_dir() else []:
        if len(out) >= limit:
            break
        run = view(path.stem, journal.read_events(path))
        if wanted is None or wanted & set(run.hosts):
            out.append(run)
    return out


def last_touch(runs: Iterable[RunView]) -> dict[str, dict[str, Any]]:
    """Per host: the run that acted on it last and what it did to it. Runs overlap (two operators, a
    long rollout and a CLI deploy), so this is the run with the latest event on that host, not the one
    that started last (``runs`` newest first: on a tie, the newer run)."""
    out: dict[str, dict[str, Any]] = {}
    when: dict[str, float] = {}
    for run in runs:
        for host, result in run.hosts.items():
            at = run.touched.get(host, run.started or 0.0)
            if host in out and at <= when[host]:
                continue
            when[host] = at
            out[host] = {"run_id": run.run_id, "result": result, "status": run.status, "started": run.started,
                         "check": run.check, "touched": at}
    return out


def _why(stop: Mapping[str, Any] | None) -> str | None:
    if not stop:
        return None
    if stop.get("event") == "interrupted":
        return f"interrupted in batch {stop.get('batch')}"
    return f"halted after batch {stop.get('batch')}: {stop.get('why', '?')}"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _strs(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []
