"""Warm-up and canary analysis: what a release serves like, measured on the host, against what
the release before it served like there.

The warm-up sends the spec's generations once ``/health`` is 200 (SGLang has no acceptance
length until it has run a speculative decode step), reading SGLang's own per-request numbers
(``meta_info``: completion tokens, verify steps, latency). The result is kept with the release on
the host (``releases/<id>/canary.json``), so the next release there is compared with it: the
canary gate fails when acceptance length or decode tokens/s falls more than the allowed percent
below the previous release's, or under an absolute floor, and says both numbers.
"""

from __future__ import annotations

from typing import Any

from fleetctl.probes.http import DEFAULT_SERVICE_HOST
from fleetctl.release.service import HostLayout
from fleetctl.release.spec import Canary, Warmup
from fleetctl.transport.base import HostSession

MODULE = "warmup"


def release_dir(layout: HostLayout, release_id: str) -> str:
    return f"{layout.root}/releases/{release_id}"


def warm_up(session: HostSession, warmup: Warmup, port: int) -> tuple[bool, str, dict[str, Any]]:
    """(ok, detail, measurement): every request must be answered, all within ``warmup.timeout``
    seconds together (a server that hangs fails the gate then, not once per request)."""
    measured = dict(session.call(MODULE, {
        "op": "measure", "host": str(session.vars.get("service_host") or DEFAULT_SERVICE_HOST), "port": port,
        "path": warmup.path, "requests": warmup.requests, "max_tokens": warmup.max_tokens,
        "prompt": warmup.prompt, "timeout": warmup.timeout,
    }, timeout=warmup.timeout + 30))
    if measured.get("timed_out"):
        return False, f"no answer from {warmup.path} within the warm-up's {warmup.timeout:g}s " \
                      f"({measured['ok']} of {measured['requests']} requests answered)", measured
    if measured["ok"] < measured["requests"]:
        return False, f"{measured['requests'] - measured['ok']} of {measured['requests']} warm-up requests " \
                      f"failed: {'; '.join(measured['errors'][:2])}", measured
    return True, describe(measured), measured


def describe(m: dict[str, Any]) -> str:
    accept = f"accept length {m['accept_length']:.2f}" if m.get("accept_length") is not None else \
        "no speculative stats"
    tps = f"{m['decode_tps']:.1f} tok/s" if m.get("decode_tps") is not None else "no timing"
    return f"{m['requests']} requests, {m['tokens']} tokens: {accept}, {tps}"


def save(session: HostSession, layout: HostLayout, release_id: str, measured: dict[str, Any],
         instance: str | None = None) -> None:
    session.call(MODULE, {"op": "save", "release_dir": release_dir(layout, release_id), "measurement": measured,
                          **({"instance": instance} if instance else {})})


def load(session: HostSession, layout: HostLayout, release_id: str | None,
         instance: str | None = None) -> dict[str, Any] | None:
    if not release_id:
        return None
    found = session.call(MODULE, {"op": "load", "release_dir": release_dir(layout, release_id),
                                  **({"instance": instance} if instance else {})})
    return found.get("measurement") if found.get("found") else None


def judge(canary: Canary, now: dict[str, Any], before: dict[str, Any] | None, previous: str | None) -> \
        tuple[bool, str]:
    """Pure: the canary verdict and the numbers that decided it."""
    problems, parts = [], []
    for key, label, floor in (("accept_length", "accept length", canary.min_accept_length),
                              ("decode_tps", "decode tok/s", canary.min_decode_tps)):
        value = now.get(key)
        old = (before or {}).get(key)
        if value is None:
            if floor is not None or (old is not None and canary.max_regression_percent is not None):
                problems.append(f"{label}: not measured")
            continue
        text = f"{label} {value:g}"
        if old:
            change = (value - old) / old * 100
            text += f" vs {old:g} on {previous} ({change:+.1f}%)"
            if canary.max_regression_percent is not None and change < -canary.max_regression_percent:
                problems.append(f"{label} {value:g} is {-change:.1f}% below {previous}'s {old:g} "
                                f"(at most {canary.max_regression_percent:g}% allowed)")
        if floor is not None and value < floor:
            problems.append(f"{label} {value:g} is below the floor {floor:g}")
        parts.append(text)
    if problems:
        return False, "; ".join(problems)
    baseline = "" if before else f" (no earlier measurement{' of ' + previous if previous else ''} on this host)"
    return True, "; ".join(parts) + baseline
