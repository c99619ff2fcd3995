"""The gates that need live traffic, after every server of the host passed the others: thresholds with a
``window`` and the live canary (``health.canary.baseline``), the canary host against the rollout's hosts
still on the release it replaced, under the same traffic, with SGLang's own numbers (Argo Rollouts'
analysis against a baseline).

Behind a gateway each worker first goes back into rotation (it has had no traffic since its drain).
For the canary, its ``/metrics`` and every baseline host's are scraped, ``window`` seconds pass, and
all are scraped again. The baseline hosts are the run's other hosts (``HostContext.peers``) whose
``current`` is the release this host ran before; their histograms and counters are pooled. Each check
fails when the canary's value is more than ``max_ratio`` times the baseline's, or when either side
finished fewer than ``min_requests``; the line says both numbers. A failure takes the workers out of
rotation again before the host rolls back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from fleetctl.errors import FleetError, HostError
from fleetctl.gateway.workers import gateways_of
from fleetctl.probes import prometheus as prom
from fleetctl.release import drain, metric_threshold
from fleetctl.release import instances as insts
from fleetctl.release.gates import GateResult
from fleetctl.release.health_spec import CanaryBaseline, CanaryCheck, Health, Threshold
from fleetctl.release.service import HostLayout, control, layout_for, listen
from fleetctl.release.spec import ReleaseSpec
from fleetctl.transport.base import HostSession

HISTOGRAMS = {"ttft": "sglang:time_to_first_token_seconds", "itl": "sglang:inter_token_latency_seconds"}
REQUESTS = "sglang:num_requests_total"
ABORTED = "sglang:num_aborted_requests_total"
Window = list[tuple[prom.Scrape, prom.Scrape]]  # (before, after) of each host of one side


@dataclass(frozen=True)
class Server:
    """One of the canary host's servers the analysis covers."""

    name: str | None
    port: int
    baseline: CanaryBaseline | None = None
    thresholds: tuple[Threshold, ...] = ()  # the ones with a window: read under live traffic

    @property
    def prefix(self) -> str:
        return f"{self.name}: " if self.name else ""


def label(check: CanaryCheck) -> str:
    if check.measure == "error_rate":
        return "error rate"
    return f"{check.measure} p{(check.quantile or 0.99) * 100:g}"


def side(cfg: CanaryBaseline, window: Window) -> tuple[float, dict[str, float | None]]:
    """Pure: (requests finished, each check's value) of one side, its hosts pooled."""
    requests = sum(prom.counter_delta(b, a, REQUESTS, cfg.labels) for b, a in window)
    values: dict[str, float | None] = {}
    for check in cfg.checks:
        if check.measure == "error_rate":
            aborted = sum(prom.counter_delta(b, a, ABORTED, cfg.labels) for b, a in window)
            values[label(check)] = aborted / requests if requests else None
            continue
        pooled: dict[float, float] = {}
        for b, a in window:
            for le, n in prom.bucket_delta(b, a, HISTOGRAMS[check.measure], cfg.labels).items():
                pooled[le] = pooled.get(le, 0.0) + n
        values[label(check)] = prom.quantile(check.quantile or 0.99, pooled)
    return requests, values


def judge(cfg: CanaryBaseline, canary: Window, baseline: Window, hosts: list[str]) -> tuple[bool, str]:
    """Pure: the verdict, with both numbers of every check."""
    (n_new, new), (n_old, old) = side(cfg, canary), side(cfg, baseline)
    where = ", ".join(hosts)
    if n_new < cfg.min_requests or n_old < cfg.min_requests:
        return False, (f"too few requests to judge in {cfg.window:g}s: {n_new:g} on the canary, {n_old:g} on "
                       f"{where} (at least {cfg.min_requests} each)")
    parts: list[str] = []
    problems: list[str] = []
    for check in cfg.checks:
        key = label(check)
        a, b = new[key], old[key]
        if a is None or b is None:
            problems.append(f"{key}: nothing observed ({'canary' if a is None else where})")
            continue
        ratio = a / b if b else (1.0 if a == 0 else float("inf"))
        unit = "" if check.measure == "error_rate" else "s"
        text = (f"{key} {a:.4g}{unit} on the canary vs {b:.4g}{unit} on {where} ({ratio:.2f}x, "
                f"at most {check.max_ratio:g}x)")
        (problems if ratio > check.max_ratio else parts).append(text)
    counted = f" [{n_new:g} vs {n_old:g} requests in {cfg.window:g}s]"
    return (False, "; ".join(problems + parts) + counted) if problems else (True, "; ".join(parts) + counted)


def baseline_hosts(session: HostSession, previous: str, name: str | None) -> tuple[list[tuple[HostSession, int]],
                                                                                    list[str]]:
    """The run's other hosts now on ``previous`` with their server ``name``'s port; and the ones that
    could not be asked (left out, said in the result)."""
    found, skipped = [], []
    peers: Callable[[], list[HostSession]] | None = getattr(session, "peers", None)
    for peer in peers() if peers is not None else []:
        try:
            layout = layout_for(peer.vars)
            if peer.call("release_host", {"op": "state", **layout.params()}).get("current") != previous:
                continue
            port = int(peer.call("service_host", control(layout, "status", name)).get("port") or 30000)
        except FleetError as exc:
            skipped.append(f"{peer.name} ({getattr(exc, 'reason', exc)})")
            continue
        found.append((peer, port))
    return found, skipped


def scrape_all(targets: list[tuple[HostSession, int]]) -> list[prom.Scrape]:
    return [prom.scrape(s, port, time.monotonic()) for s, port in targets]


def analyse(session: HostSession, servers: list[Server], previous: str,
            sleep: Callable[[float], None] = time.sleep) -> list[GateResult]:
    """One gate per server: its canary window against the baseline hosts' (module docstring)."""
    out = []
    for server in servers:
        if server.baseline is None:
            continue
        name = f"canary vs hosts on {previous}" + (f" ({server.name})" if server.name else "")
        start = time.monotonic()
        peers, skipped = baseline_hosts(session, previous, server.name)
        left = f"; left out: {', '.join(skipped)}" if skipped else ""
        if not peers:
            out.append(GateResult(name, True, f"no other host of this run serves {previous}: nothing to compare "
                                              f"with{left}"))
            continue
        targets = [(session, server.port), *peers]
        try:
            before = scrape_all(targets)
            sleep(server.baseline.window)
            after = scrape_all(targets)
            pairs = list(zip(before, after, strict=True))
            ok, detail = judge(server.baseline, pairs[:1], pairs[1:], [p.name for p, _ in peers])
        except prom.MetricsError as exc:
            ok, detail = False, str(exc)
        out.append(GateResult(name, ok, detail + left, time.monotonic() - start))
        if not ok:
            break
    return out


def servers_of(spec: ReleaseSpec, layout: HostLayout) -> list[tuple[str | None, int, Health]]:
    """Each of the release's servers on this host: (instance name, port, its gates)."""
    return [(i.name, listen(spec, layout, i)[1], insts.health_of(spec, i)) for i in insts.of_spec(spec)]


def live(spec: ReleaseSpec, layout: HostLayout) -> list[Server]:
    """The servers with gates that need live traffic: a canary ``baseline``, thresholds with a ``window``."""
    out = []
    for name, port, health in servers_of(spec, layout):
        baseline = health.canary.baseline if health.canary is not None else None
        windowed = tuple(t for t in health.thresholds if t.live)
        if baseline is not None or windowed:
            out.append(Server(name, port, baseline, windowed))
    return out


def windowed(session: HostSession, servers: list[Server], sleep: Callable[[float], None]) -> list[GateResult]:
    """Each server's thresholds with a window, in order, until one fails."""
    out = []
    for server in servers:
        for t in server.thresholds:
            start = time.monotonic()
            name, ok, detail = metric_threshold.metric_gate(session, t, server.port, sleep)
            out.append(GateResult(server.prefix + name, ok, detail, time.monotonic() - start))
            if not ok:
                return out
    return out


def run(session: HostSession, servers: list[Server], previous: str | None,
        sleep: Callable[[float], None] = time.sleep) -> list[GateResult]:
    """The gates that need live traffic, once every server passed the others: behind the host's gateways
    its workers go into rotation first, and out again on a failure (a gateway that fails meanwhile
    fails the gates: the host still rolls back). The windowed thresholds, then the canary (none
    without ``previous``, a first deploy: nothing to compare with)."""
    canary = previous is not None and any(s.baseline is not None for s in servers)
    if not canary and not any(s.thresholds for s in servers):
        return []
    gateways = gateways_of(session.name, session.vars)
    ports = [s.port for s in servers]
    steps: list[GateResult] = []
    try:
        steps += [replace(g, name=g.name.replace("back in ", "in rotation for the live gates: "))
                  for g in (drain.put_back(session, gateways, ports) if gateways else [])]
        steps += windowed(session, servers, sleep)
        if canary and previous is not None and all(g.ok for g in steps):
            steps += analyse(session, servers, previous, sleep)
    except HostError as exc:
        steps.append(GateResult("live gates: gateway", False, exc.reason))
    if gateways and not all(g.ok for g in steps):
        try:
            steps += drain.take_out(session, gateways, ports)
        except HostError as exc:
            steps.append(GateResult("live gates: gateway", False,
                                    f"could not take the workers out again: {exc.reason}"))
    return steps


def planned(spec: ReleaseSpec, layout: HostLayout) -> list[GateResult]:
    """Check mode: the metrics each server's gates would read."""
    out = []
    for name, port, health in servers_of(spec, layout):
        who = f"{name}: " if name else ""
        for t in health.thresholds:
            if t.metric is not None:
                when = " (in rotation, after the other gates)" if t.live else ""
                out.append(GateResult(f"{who}threshold: would read", True,
                                      f"GET {t.asked} on port {port}: {metric_threshold.gate_name(t)}{when}"))
        cfg = health.canary.baseline if health.canary is not None else None
        if cfg is not None:
            checks = ", ".join(f"{label(c)} at most {c.max_ratio:g}x" for c in cfg.checks)
            out.append(GateResult(f"{who}canary: would compare", True,
                                  f"GET /metrics on port {port} and on the run's hosts still on the previous "
                                  f"release, {cfg.window:g}s apart: {checks} ({', '.join(metrics_read(cfg))})"))
    return out


def metrics_read(cfg: CanaryBaseline) -> list[str]:
    names = [REQUESTS]
    names += [ABORTED if c.measure == "error_rate" else f"{HISTOGRAMS[c.measure]}_bucket" for c in cfg.checks]
    return [prom.describe(n, cfg.labels) for n in dict.fromkeys(names)]
