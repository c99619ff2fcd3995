"""A threshold on a Prometheus metric of the server (``health.thresholds[].metric``): the value read from
``/metrics`` on the host, as it is (a gauge, a counter), as a counter's ``rate`` or as a histogram's
``quantile`` over ``window`` seconds (two scrapes that far apart). Parsing and the math are
``probes/prometheus.py``'s; this module names the gate and judges the bounds."""

from __future__ import annotations

import time
from collections.abc import Callable

from fleetctl.probes import prometheus as prom
from fleetctl.release.health_spec import Threshold
from fleetctl.transport.base import HostSession


def expression(t: Threshold) -> str:
    """What is read, in PromQL's words (``histogram_quantile(0.99, ...[30s])``)."""
    series = prom.describe(t.metric or "", t.labels)
    if t.rate:
        return f"rate({series}[{t.window:g}s])"
    if t.quantile is not None:
        over = f"[{t.window:g}s]" if t.window else " since start"
        return f"histogram_quantile({t.quantile:g}, {series}{over})"
    return series


def bounds(t: Threshold) -> list[str]:
    return ([f">= {t.min:g}"] if t.min is not None else []) + ([f"<= {t.max:g}"] if t.max is not None else [])


def gate_name(t: Threshold) -> str:
    return " ".join([expression(t), *bounds(t)])


def value_of(t: Threshold, before: prom.Scrape | None, after: prom.Scrape) -> float | None:
    """Pure: the threshold's number from one scrape (``before`` None) or two; None: a histogram that
    observed nothing in the window."""
    name = t.metric or ""
    if t.rate:
        assert before is not None, "a rate is read from two scrapes"
        return prom.rate(before, after, name, t.labels)
    if t.quantile is not None:
        return prom.quantile(t.quantile, prom.bucket_delta(before, after, name, t.labels))
    return prom.total(after, name, t.labels)


def judge(t: Threshold, value: float | None) -> tuple[bool, str]:
    if value is None:
        return False, f"{t.metric} observed nothing{f' in {t.window:g}s' if t.window else ''}: nothing to judge"
    ok = (t.min is None or value >= t.min) and (t.max is None or value <= t.max)
    return ok, f"{expression(t)} = {value:g}"


def metric_gate(session: HostSession, t: Threshold, port: int,
                sleep: Callable[[float], None] = time.sleep) -> tuple[str, bool, str]:
    """(gate name, ok, detail): the metric read on the host (twice, ``window`` apart, for a rate or
    a windowed quantile) and judged; an unreadable ``/metrics`` or a missing series fails the gate."""
    try:
        before = None
        if t.window:
            before = prom.scrape(session, port, time.monotonic(), t.asked, t.timeout)
            sleep(t.window)
        after = prom.scrape(session, port, time.monotonic(), t.asked, t.timeout)
        ok, detail = judge(t, value_of(t, before, after))
    except prom.MetricsError as exc:
        return gate_name(t), False, str(exc)
    return gate_name(t), ok, detail
