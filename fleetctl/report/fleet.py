"""``fleetctl report``: the fleet at a glance. Pure: what ``report_data.gather`` found becomes one
JSON-able document (``build``); ``--json`` prints it and the HTML page renders exactly it.

Each host row judges five things red / amber / green, always with a text verdict beside the colour:
- release: a current release (green), none (amber), its state unreadable (red);
- service and health, per instance: running and /health answering 200 (green), else red;
- drift: the worst finding class (``drift_report.kind_level``: red for version, missing,
  duplicate-dist-info, modified-file, missing-file; amber for the others; patched/overlay are green);
- GPU: ``gpu_health``'s verdict, with its worst rule and that rule's value;
- last run: what the journal that acted on the host last did to it (failed or unreachable: red;
  rolled back or never finished: amber; ok or changed: green; no run: nothing to judge);
- release split: a host of a group whose hosts run different releases, off the group's majority
  release (every host of the group when none holds a majority): amber, naming each release's hosts;
- gateway (hosts with ``router_url``): each of its servers registered and serving in each of its
  gateways (green), else amber, saying which worker is out of which gateway and why (a gateway that
  does not answer: amber, and a note); the gateways' own listings are a section of their own;
- the host itself: unreachable or failed is red whatever else is known.
The row's verdict is the worst of them; rows are sorted worst first, then by name.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fleetctl.drift import report as drift_report
from fleetctl.gateway.status import GatewayStatus
from fleetctl.gpu.health import HostHealth, Level
from fleetctl.release.manage import HostStatus
from fleetctl.report.data import Gathered, HostGathered
from fleetctl.transport.base import HostResult

RANK = {"red": 0, "amber": 1, "green": 2, "none": 3}
RUN_LEVELS = {"unreachable": "red", "failed": "red", "rolled back": "amber", "incomplete": "amber",
              "changed": "green", "ok": "green"}
ROLLBACK_WORDS = ("rollback", "rolled back", "restart failed", "gate")
PALETTE = 8  # release colours in the timeline (r0..r7); each segment also carries its id as text


def verdict(level: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"level": level, "text": text, **extra}


def worst(levels: list[str]) -> str:
    judged = [lv for lv in levels if lv != "none"]
    return min(judged, key=RANK.__getitem__) if judged else "none"


def release_verdict(status: HostStatus | None, error: str | None) -> dict[str, Any]:
    """Which release the host has (its service is judged per instance, in ``instances``)."""
    if status is None:
        return verdict("red", f"release state unreadable: {error or '?'}", current=None, previous=None)
    if not status.current:
        return verdict("amber", "no release", current=None, previous=status.previous)
    bad = [m["problem"] or f"model {m['role']}: {m['state']}" for m in status.models if m["state"] != "ok"]
    return verdict("red" if bad else "green", "; ".join([status.current, *bad]), current=status.current,
                   previous=status.previous, models=status.models)


def instances(status: HostStatus | None) -> list[dict[str, Any]]:
    """Service and health per serving instance (one per host today: the current release's service)."""
    if status is None or not status.current:
        return []
    running = bool(status.service.get("running"))
    healthy = running and status.health == "200"
    level = "green" if healthy else "red"
    text = f"{'running' if running else 'stopped'}, health {status.health}"
    return [verdict(level, text, name=str(status.service.get("name") or "sglang"),
                    service="running" if running else "stopped", health=status.health,
                    pid=status.service.get("pid"))]


def gpu_verdict(health: HostHealth | None, models: list[str], error: str | None) -> dict[str, Any]:
    if health is None:
        return verdict("amber", f"GPU facts unreadable: {error or '?'}", rule=None, value=None, models=[])
    shown = [f"{models.count(m)}x {m}" for m in dict.fromkeys(models)]
    bad = health.checks_at(Level.RED) or health.checks_at(Level.AMBER)
    if not bad:
        n = len(models)
        text = f"{n} GPU{'s' if n != 1 else ''}, every check green" if n else "no GPU found"
        return verdict("green", text, rule=None, value=None, models=shown)
    gpu, check = bad[0]
    where = "host" if gpu.index is None else f"GPU {gpu.index}"
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return verdict(health.level.value, f"{where} {check.rule}: {check.value}{more}", rule=check.rule,
                   value=check.value, models=shown)


def run_verdict(touch: Mapping[str, Any] | None) -> dict[str, Any]:
    if touch is None:
        return verdict("none", "no run in the journals", run_id=None, result=None, started=None)
    result = str(touch["result"])
    check = " (check mode)" if touch.get("check") else ""
    return verdict(RUN_LEVELS.get(result, "amber"), f"{result}{check}", run_id=touch["run_id"], result=result,
                   started=touch.get("started"), run_status=touch.get("status"))


def release_splits(g: Gathered) -> list[dict[str, Any]]:
    """The groups whose reachable hosts run more than one release: per group, release -> its hosts."""
    current = {n: r.value.release.current for n, r in g.hosts.items()
               if r.value is not None and r.value.release is not None and r.value.release.current}
    wanted = g.request.split_groups
    splits = []
    for group in sorted({grp for gs in g.request.groups.values() for grp in gs}):
        if wanted is not None and group not in wanted:
            continue
        on: dict[str, list[str]] = {}
        for host in sorted(h for h, gs in g.request.groups.items() if group in gs and h in current):
            on.setdefault(current[host], []).append(host)
        if len(on) > 1:
            splits.append({"group": group, "releases": dict(sorted(on.items(), key=lambda kv: (-len(kv[1]), kv[0])))})
    return splits


def split_verdict(host: str, splits: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Amber for a host of a split group that is off the group's majority release (every host of the
    group when no release holds a majority), naming every release and its hosts."""
    for split in splits:
        on = split["releases"]
        mine = next((rid for rid, hosts in on.items() if host in hosts), None)
        if mine is None:
            continue
        total, (top, top_hosts) = sum(len(h) for h in on.values()), next(iter(on.items()))
        if mine == top and 2 * len(top_hosts) > total:
            continue
        shown = "; ".join(f"{rid} on {', '.join(hosts)}" for rid, hosts in on.items())
        return verdict("amber", f"group {split['group']} runs {len(on)} releases: {shown}", group=split["group"])
    return None


def gateway_verdict(host: str, gateways: list[GatewayStatus]) -> dict[str, Any]:
    """The host's workers in its gateways (rows ``gateway_status`` joined to this host)."""
    mine = [(g, w) for g in gateways for w in g.workers if w.host == host]
    down = [g for g in gateways if g.error]
    if not mine and not down:
        return verdict("none", "no gateway", workers=[])
    out = [f"{w.url} {w.status} in {g.url}: {w.why}" for g, w in mine if not w.serving]
    out += [f"gateway {g.url} did not answer" for g in down]
    rows = [{"gateway": g.url, **w.to_dict()} for g, w in mine]
    if out:
        return verdict("amber", "; ".join(out), workers=rows)
    shown = ", ".join(sorted({g.url for g, _ in mine}))
    return verdict("green", f"{len(mine)} worker{'s' if len(mine) != 1 else ''} serving in {shown}", workers=rows)


def host_row(name: str, res: HostResult[HostGathered], groups: list[str], drift_v: dict[str, Any],
             touch: Mapping[str, Any] | None, split: dict[str, Any] | None = None,
             gateway: dict[str, Any] | None = None) -> dict[str, Any]:
    g = res.value
    row: dict[str, Any] = {"host": name, "groups": groups, "status": res.status.value, "reason": res.reason,
                           "last_run": run_verdict(touch)}
    if g is None:
        unknown = verdict("none", "unknown (host not reached)")
        row.update(release={**unknown, "current": None, "previous": None}, instances=[],
                   drift={**unknown, "counts": {}}, gpu={**unknown, "rule": None, "value": None, "models": []},
                   gateway={**unknown, "workers": []})
        row.update(level="red", problems=[f"{res.status.value}: {res.reason}"])
        return row
    row.update(release=release_verdict(g.release, g.errors.get("release")), instances=instances(g.release),
               drift=drift_v, gpu=gpu_verdict(g.gpu, g.gpu_models, g.errors.get("gpu")),
               gateway=gateway or verdict("none", "no gateway", workers=[]))
    row["split"] = split
    parts = {"release": row["release"], **({"release split": split} if split else {}), "drift": row["drift"],
             "GPU": row["gpu"], "gateway": row["gateway"],
             "last run": row["last_run"], **{f"instance {i['name']}": i for i in row["instances"]}}
    row["level"] = worst([p["level"] for p in parts.values()])
    row["problems"] = [f"{k}: {p['text']}" for k, p in parts.items() if p["level"] in ("red", "amber")]
    return row


def timeline(host: str, history: list[dict[str, Any]], start: float, now: float,
             colours: Mapping[str, str]) -> dict[str, Any]:
    """The host's release switches over [start, now]: one segment per release held (left and width in
    percent of the window), and the switches as text, oldest first. ``colours``: release id -> r0..r7."""
    switches = sorted((h for h in history if isinstance(h.get("time"), int | float)), key=lambda h: h["time"])
    span = max(now - start, 1.0)
    segments = []
    for i, h in enumerate(switches):
        end = switches[i + 1]["time"] if i + 1 < len(switches) else now
        rid = str(h.get("to") or "?")
        segments.append({"release": rid, "start": h["time"], "end": end, "colour": colours.get(rid, "r0"),
                         "left": round(100 * (h["time"] - start) / span, 2),
                         "width": round(max(100 * (end - h["time"]) / span, 0.5), 2)})
    shown = [{"time": h["time"], "from": h.get("from"), "to": h.get("to"), "reason": str(h.get("reason") or ""),
              "who": str(h.get("who") or ""), "rollback": _is_rollback(str(h.get("reason") or ""))}
             for h in switches]
    return {"host": host, "segments": segments, "switches": shown}


def colours(histories: Mapping[str, list[dict[str, Any]]]) -> dict[str, str]:
    """Release id -> colour class, in the order the fleet first switched to each: the releases of one
    page get distinct colours (up to PALETTE of them; beyond, the id written in each segment tells)."""
    seen = sorted((h["time"], str(h.get("to") or "?")) for hs in histories.values() for h in hs
                  if isinstance(h.get("time"), int | float))
    order = list(dict.fromkeys(rid for _, rid in seen))
    return {rid: f"r{i % PALETTE}" for i, rid in enumerate(order)}


def _is_rollback(reason: str) -> bool:
    return any(w in reason.lower() for w in ROLLBACK_WORDS)


def build(g: Gathered, now: float | None = None) -> dict[str, Any]:
    """The whole page as data: summary, host rows (worst first), drift, rollouts, timelines."""
    from fleetctl.report.runs import last_touch

    now = time.time() if now is None else now
    touched = last_touch(g.runs)
    splits = release_splits(g)
    rows = [host_row(name, res, g.request.groups.get(name, []), drift_report.host_verdict(g.drift, name),
                     touched.get(name), split_verdict(name, splits), gateway_verdict(name, mine(g, name)))
            for name, res in g.hosts.items()]
    rows.sort(key=lambda r: (RANK[r["level"]], r["host"]))
    histories = {n: r.value.history for n, r in g.hosts.items() if r.value is not None and r.value.history}
    times = [h["time"] for hs in histories.values() for h in hs if isinstance(h.get("time"), int | float)]
    start = min(times, default=now)
    palette = colours(histories)
    counts = {lv: sum(1 for r in rows if r["level"] == lv) for lv in ("red", "amber", "green")}
    notes = []
    wanted = g.request.baseline_host
    if wanted and g.drift.baseline.host != wanted:
        notes.append(f"baseline host {wanted} did not answer: drift is judged against {g.drift.baseline.source}")
    notes += [f"gateway {gw.url} did not answer: {gw.error}" for gw in g.gateways if gw.error]
    notes += [f"release split in group {sp['group']}: " + "; ".join(f"{rid} on {', '.join(hs)}"
                                                                    for rid, hs in sp["releases"].items())
              for sp in splits]
    return {
        "generated": now,
        "summary": {"hosts": len(rows), **counts, "line": _summary_line(len(rows), counts)},
        "groups": sorted({grp for r in rows for grp in r["groups"]}),
        "splits": splits,
        "hosts": rows,
        "drift": drift_report.to_view(g.drift, g.request.show_all),
        "rollouts": [run.to_dict() for run in g.runs],
        "gateways": [gw.to_dict() for gw in g.gateways],
        "timelines": [timeline(n, hs, start, now, palette) for n, hs in sorted(histories.items())],
        "window": {"start": start, "end": now},
        "notes": notes,
    }


def mine(g: Gathered, host: str) -> list[GatewayStatus]:
    """The gateways in front of ``host`` (its router_url), as the report found them."""
    res = g.hosts.get(host)
    urls = {u for w in (res.value.workers if res and res.value else []) for u in w["gateways"]}
    return [gw for gw in g.gateways if gw.url in urls]


def _summary_line(total: int, counts: Mapping[str, int]) -> str:
    return (f"{total} host{'s' if total != 1 else ''}: {counts['red']} red, {counts['amber']} amber, "
            f"{counts['green']} green")


def exit_code(doc: Mapping[str, Any]) -> int:
    """2 when a host failed or was unreachable, else 1 when any host is red, else 0."""
    from fleetctl.errors import ExitCode

    if any(r["status"] != "ok" for r in doc["hosts"]):
        return int(ExitCode.HOST_FAILED)
    return int(ExitCode.BAD_ANSWER if doc["summary"]["red"] else ExitCode.OK)


def to_html(doc: Mapping[str, Any]) -> str:
    from fleetctl.pages import render as report_html

    return report_html.render("fleet.html.j2", doc=doc, rank=RANK, kinds=[k.value for k in drift_report.CELL_KINDS])
