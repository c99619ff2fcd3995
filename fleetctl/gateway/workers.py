"""Which gateways front a host, and the worker URL a host's server has in them: read from the host's
variables (``router_url``: a URL or a list; ``router_worker_host``, else ``ansible_host``, else the name)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fleetctl.errors import InputError

ROUTER_VAR = "router_url"


def gateways_of(name: str, host_vars: Mapping[str, Any]) -> list[str]:
    """The host's gateways (``router_url``: a URL or a list of them); [] when none is configured."""
    raw = host_vars.get(ROUTER_VAR)
    urls = [raw] if isinstance(raw, str) else list(raw) if isinstance(raw, (list, tuple)) else []
    if raw is not None and not urls and raw != []:
        raise InputError(f"{name}: {ROUTER_VAR} must be a URL or a list of URLs, got {raw!r}")
    for url in urls:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InputError(f"{name}: {ROUTER_VAR}: {url!r} is not an http(s) URL")
    return [u.rstrip("/") for u in urls]


def worker_url(name: str, host_vars: Mapping[str, Any], port: int) -> str:
    address = host_vars.get("router_worker_host") or host_vars.get("ansible_host") or name
    return f"http://{address}:{port}"


def expected_workers(name: str, host_vars: Mapping[str, Any], servers: Sequence[Mapping[str, Any]],
                     release: str | None) -> list[dict[str, Any]]:
    """The host's servers as the workers its gateways should have (one per server instance): url,
    gateways, and what the host says of each (running, /health answer, release); [] without router_url."""
    gateways = gateways_of(name, host_vars)
    if not gateways:
        return []
    return [{"url": worker_url(name, host_vars, int(s.get("port") or 30000)), "gateways": gateways,
             "running": bool(s.get("running")), "health": s.get("health"), "release": release} for s in servers]
