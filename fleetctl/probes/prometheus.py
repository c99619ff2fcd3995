"""A server's Prometheus ``/metrics``, read on its host and parsed on the controller (pure math here).

The text exposition format is parsed by ``prometheus_client``'s own parser. A series is chosen by its
sample name as the server writes it (``sglang:num_requests_total``, ``sglang:num_queue_reqs``) and by
label matchers (every given label equal); the matching series are summed, as PromQL's ``sum(...)``.
A histogram quantile is ``histogram_quantile``'s: linear interpolation inside the bucket that holds
the rank, the lower edge of the first bucket taken as 0, and the highest finite bound when the rank
falls in the ``+Inf`` bucket. Over a window, counters and buckets are the difference of two scrapes
(a counter that went down - the server restarted - counts from 0, as ``rate`` does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from fleetctl.transport.base import HostSession

Series = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)


class MetricsError(ValueError):
    """The server's /metrics cannot be read or parsed, or lacks what is asked."""


@dataclass(frozen=True)
class Scrape:
    """One read of ``/metrics``: every sample by series, and when (the controller's monotonic clock)."""

    samples: Mapping[Series, float]
    at: float = 0.0


def parse(text: str, at: float = 0.0) -> Scrape:
    samples: dict[Series, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    except ValueError as exc:  # the parser's only complaint about a malformed line
        raise MetricsError(f"/metrics is not Prometheus text: {exc}") from None
    return Scrape(samples, at)


def matching(scrape: Scrape, name: str, labels: Mapping[str, str]) -> dict[Series, float]:
    return {k: v for k, v in scrape.samples.items()
            if k[0] == name and all(dict(k[1]).get(key) == want for key, want in labels.items())}


def total(scrape: Scrape, name: str, labels: Mapping[str, str]) -> float:
    """The sum of every series of ``name`` whose labels match; absent: ``MetricsError``."""
    found = matching(scrape, name, labels)
    if not found:
        raise MetricsError(f"no series {describe(name, labels)} in /metrics")
    return sum(found.values())


def counter_delta(before: Scrape, after: Scrape, name: str, labels: Mapping[str, str]) -> float:
    """How much ``name`` grew between two scrapes, series by series (a reset counts from 0)."""
    now = matching(after, name, labels)
    if not now:
        raise MetricsError(f"no series {describe(name, labels)} in /metrics")
    was = matching(before, name, labels)
    return sum(v - was.get(k, 0.0) if v >= was.get(k, 0.0) else v for k, v in now.items())


def rate(before: Scrape, after: Scrape, name: str, labels: Mapping[str, str]) -> float:
    """Per second, over the time between the scrapes."""
    seconds = after.at - before.at
    if seconds <= 0:
        raise MetricsError("a rate needs two scrapes apart in time")
    return counter_delta(before, after, name, labels) / seconds


def buckets(scrape: Scrape, name: str, labels: Mapping[str, str]) -> dict[float, float]:
    """A histogram's cumulative buckets (upper bound -> count), summed over the matching series."""
    out: dict[float, float] = {}
    for (_, series), value in matching(scrape, f"{name}_bucket", labels).items():
        le = float(dict(series).get("le", "nan"))
        if not math.isnan(le):
            out[le] = out.get(le, 0.0) + value
    if not out:
        raise MetricsError(f"no histogram {describe(name, labels)} (no {name}_bucket series) in /metrics")
    return out


def bucket_delta(before: Scrape | None, after: Scrape, name: str, labels: Mapping[str, str]) -> dict[float, float]:
    """The histogram of what was observed between the scrapes (all of it when ``before`` is None)."""
    now = buckets(after, name, labels)
    if before is None:
        return now
    try:
        was = buckets(before, name, labels)
    except MetricsError:  # nothing observed yet at the first scrape
        return now
    if any(now[le] < was.get(le, 0.0) for le in now):  # the server restarted between the scrapes
        return now
    return {le: now[le] - was.get(le, 0.0) for le in now}


def quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """``histogram_quantile(q, ...)`` over cumulative buckets; None when nothing was observed."""
    bounds = sorted(cumulative)
    if not bounds or not math.isinf(bounds[-1]):
        raise MetricsError("a histogram needs its +Inf bucket")
    count = cumulative[bounds[-1]]
    if count <= 0:
        return None
    rank = q * count
    lower, below = 0.0, 0.0
    for le in bounds:
        upto = cumulative[le]
        if upto >= rank:
            if math.isinf(le):  # beyond the highest finite bound: that bound is all one can say
                return lower
            inside = upto - below
            return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = le, upto
    return lower


def describe(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def scrape(session: HostSession, port: int, at: float, path: str = "/metrics", timeout: float = 10) -> Scrape:
    """``GET /metrics`` on the host itself (where the server listens), parsed here; ``timeout``: seconds
    the server may take to answer."""
    from fleetctl.probes.http import HttpRequest, probe_http

    answer = probe_http(session, HttpRequest(path, port=port, timeout=timeout, max_text=8 << 20))
    if answer.status != 200:
        got = f"HTTP {answer.status}" if answer.status else f"{answer.error_kind}: {answer.error}"
        hint = " (SGLang serves it only with --enable-metrics)" if answer.status == 404 else ""
        raise MetricsError(f"{path} on port {port} answered {got}{hint}")
    if answer.truncated:
        raise MetricsError(f"{path} on port {port} is larger than 8 MiB: not read")
    return parse(answer.text or "", at)
