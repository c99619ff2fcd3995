"""Health gates: what must hold after a switch and restart before a release counts as deployed.

In order: ``/health`` answers 200 within the timeout (the service still running), then the
release's probes (reusing the probe commands' core), then the warm-up (generations, measured:
``release/warmup.py``), then thresholds on ``/server_info`` fields (read after the warm-up, as a
fresh server reports no acceptance length before it has served), then the canary analysis against
the release that ran before on this host. The first failure stops the gates; the caller rolls back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from fleetctl.errors import CommandError, RemoteOperationError
from fleetctl.probes.http import HttpRequest, field_value, probe_http
from fleetctl.probes.imports import ImportRequest, probe_import
from fleetctl.probes.symbols import SymbolRequest, symbol_host
from fleetctl.release import warmup
from fleetctl.release.metric_threshold import bounds, metric_gate
from fleetctl.release.service import HostLayout, control
from fleetctl.release.spec import Health, Threshold
from fleetctl.transport.base import HostSession


@dataclass(frozen=True)
class GateResult:
    name: str
    ok: bool
    detail: str
    seconds: float = 0.0
    numbers: dict[str, Any] | None = None  # what a warm-up or canary gate measured

    def to_dict(self) -> dict[str, object]:
        return self.__dict__.copy()


def run_gates(session: HostSession, health: Health, layout: HostLayout, port: int,
              release_id: str | None = None, previous: str | None = None,
              instance: str | None = None, live_later: bool = False) -> list[GateResult]:
    """``gate_in_order``, where a step that breaks on the host (a full disk, a remote error) is a
    failed gate: the caller has switched, and rolls back on any failure after the switch.
    ``live_later``: the thresholds with a window are left to ``live_canary.run`` (read in rotation)."""
    results: list[GateResult] = []
    if live_later:
        health = health.model_copy(update={"thresholds": [t for t in health.thresholds if not t.live]})
    try:
        gate_in_order(results, session, health, layout, port, release_id, previous, instance)
    except (RemoteOperationError, CommandError) as exc:
        results.append(GateResult("gates", False, f"a gate could not run on the host: {exc.reason}"))
    return results


# A playbook run's second Ctrl-C: the gates in flight end unjudged, so their hosts roll back now
# (a host left switched and not gated is what an abort must never leave).
ABORTED = GateResult("aborted", False, "a second Ctrl-C ended the gates before the release was judged")


def aborting(session: HostSession) -> bool:
    """Whether the run this session belongs to is being aborted (only a playbook run's contexts can be)."""
    check = getattr(session, "aborting", None)
    return bool(check is not None and check())


def gate_in_order(results: list[GateResult], session: HostSession, health: Health, layout: HostLayout, port: int,
                  release_id: str | None, previous: str | None, instance: str | None) -> None:
    """Every gate in order until one fails; the list says what passed and what did not. The canary's
    baseline is ``previous``'s measurement on the host, read before anything is written (``previous``
    may be ``release_id`` itself: a reconfigured release against itself as configured before). When
    every gate passed, the warm-up's measurement is kept with ``release_id`` on the host (the next
    canary's baseline; an instance's under ``release_id@NAME``); a measurement that cannot be kept (a
    full disk) fails the gates, as a release that cannot be judged next time must not pass."""
    results.append(wait_healthy(session, health, layout, port, instance, lambda: aborting(session)))
    if not results[-1].ok:
        return
    venv = f"{layout.current}/venv"
    for gate in health.probes:
        results.append(probe_gate(session, gate.symbol, gate.import_, gate.package, gate.expect, venv))
        if not results[-1].ok:
            return
    if aborting(session):  # before the long steps (warm-up, canary) and before anything is kept
        results.append(ABORTED)
        return
    measured: dict[str, Any] | None = None
    before = warmup.load(session, layout, previous, instance) if health.canary is not None else None
    if health.warmup is not None:
        start = time.monotonic()
        ok, detail, measured = warmup.warm_up(session, health.warmup, port)
        results.append(GateResult("warm-up", ok, detail, time.monotonic() - start, measured))
        if not ok:
            return
    for threshold in health.thresholds:
        results.append(threshold_gate(session, threshold, port))
        if not results[-1].ok:
            return
    if health.canary is not None and health.canary.uses_warmup and measured is not None:
        ok, detail = warmup.judge(health.canary, measured, before, previous)
        results.append(GateResult(f"canary vs {previous or 'nothing before'}", ok, detail, 0.0,
                                  {"now": measured, "before": before}))
        if not ok:
            return
    if release_id and measured is not None:
        try:
            warmup.save(session, layout, release_id, measured, instance)
        except RemoteOperationError as exc:
            results.append(GateResult("warm-up saved", False, f"the measurement could not be kept on the host: "
                                                                f"{exc.reason}"))


def wait_healthy(session: HostSession, health: Health, layout: HostLayout, port: int,
                 instance: str | None = None, stop: Callable[[], bool] | None = None) -> GateResult:
    """/health 200 from the release's own running server. A server the supervisor had to restart
    (it exited since fleetctl started it) fails at once: serving again is not the same as healthy.
    ``stop`` (the run's abort) ends the wait unjudged."""
    start = time.monotonic()
    deadline = start + health.timeout
    last = "no answer yet"
    while True:
        if stop is not None and stop():
            return replace(ABORTED, name=f"GET {health.path}", seconds=time.monotonic() - start)
        # Each request ends by the deadline: a /health that hangs cannot stretch the gate past its timeout.
        left = max(0.5, min(10.0, deadline - time.monotonic()))
        answer = probe_http(session, HttpRequest(health.path, port=port, timeout=left))
        status = session.call("service_host", {**control(layout, "status", instance),
                                               "check_listen": answer.status == 200})
        if status.get("restarts"):
            tail = " | ".join((status.get("log_tail") or [])[-3:])
            why = (f"the service exited and the supervisor restarted it {status['restarts']} time(s) "
                   f"(last: {status.get('last_exit')}); log: {tail}")
            return GateResult(f"GET {health.path}", False, why, time.monotonic() - start)
        # A 200 counts only from our own server: while it still loads (real SGLang binds its port
        # after loading the model), another process on the port must not make it look healthy.
        # (`listens` is None where the host cannot tell: systemd's server, or fds this user cannot read.)
        foreign = answer.status == 200 and status.get("running") and status.get("listens") is False
        if answer.status == 200 and status.get("running") and not foreign:
            return GateResult(f"GET {health.path}", True, "200", time.monotonic() - start)
        if answer.status == 200 and not status.get("running"):  # our server is gone: another process answers
            tail = " | ".join((status.get("log_tail") or [])[-3:])
            return GateResult(f"GET {health.path}", False, f"200, but the service is not running: another process "
                                                          f"answers on port {port}; log: {tail}",
                              time.monotonic() - start)
        last = (f"200 from another process on port {port}; the service has not bound it" if foreign else
                f"HTTP {answer.status}" if answer.status else f"{answer.error_kind}: {answer.error}")
        if not status.get("running"):
            tail = " | ".join((status.get("log_tail") or [])[-3:])
            return GateResult(f"GET {health.path}", False, f"the service exited ({last}); log: {tail}",
                              time.monotonic() - start)
        if time.monotonic() >= deadline:
            return GateResult(f"GET {health.path}", False, f"not healthy within {health.timeout:g}s (last: {last})",
                              time.monotonic() - start)
        time.sleep(health.interval)


def probe_gate(session: HostSession, symbol: str | None, target: str | None, package: str, expect: str,
               venv: str) -> GateResult:
    want = expect == "present"
    if symbol is not None:
        found = symbol_host(session, SymbolRequest(symbol, package=package, venv=venv)).defined
        name = f"symbol {symbol} {expect}"
    else:
        answer = probe_import(session, ImportRequest.parse(target or "", venv=venv))
        found = answer.present
        name = f"import {target} {expect}"
        if found != want:
            why = "imports" if found else f"{answer.error_type or 'attribute missing'}: {answer.error or ''}"
            return GateResult(name, False, why)
    return GateResult(name, found == want, "found" if found else "not found")


def threshold_gate(session: HostSession, threshold: Threshold, port: int) -> GateResult:
    """A field of a JSON answer, or a metric of ``/metrics`` (``metric_threshold.py``), within bounds."""
    if threshold.metric is not None:
        start = time.monotonic()
        name, ok, detail = metric_gate(session, threshold, port)
        return GateResult(name, ok, detail, time.monotonic() - start)
    path, field, low, high = threshold.asked, threshold.field or "", threshold.min, threshold.max
    name = " ".join([path, field, *bounds(threshold)])
    answer = probe_http(session, HttpRequest(path, port=port, timeout=threshold.timeout))
    if answer.error_kind == "timeout":  # a server wedged after accepting: the threshold's timeout ends it
        return GateResult(name, False, f"{path} did not answer within {threshold.timeout:g}s")
    if answer.status != 200 or not answer.has_json:
        return GateResult(name, False, f"{path} answered {answer.status or answer.error_kind}")
    raw = field_value(answer.body, field)
    try:
        value = float(raw)
    except (TypeError, ValueError):  # absent (the probe's sentinel) or not a number
        return GateResult(name, False, f"{field} not found or not a number in {answer.path}")
    ok = (low is None or value >= low) and (high is None or value <= high)
    return GateResult(name, ok, f"{field} = {value:g}")
