"""Every path fleetctl writes on a host, derived from two host vars (pure).

``fleetctl_root`` (default /opt/fleetctl): releases, bases, ``current``.
``fleetctl_state_dir`` (default /var/lib/fleetctl): state.json, locks, the service's pid and log,
overlay journals and manifests, the wheelhouse, caches.
A non-root user points both at folders it owns to work without become. Host-side caches fall
back to the user's own ~/.cache/fleetctl when the folder named here is not writable by it
(remote/writable.py ``user_cache_dir``), so a read-only command never fails for its cache.
"""

from __future__ import annotations

from collections.abc import Mapping

DEFAULT_ROOT = "/opt/fleetctl"
DEFAULT_STATE_DIR = "/var/lib/fleetctl"
ROOT_VAR = "fleetctl_root"
STATE_VAR = "fleetctl_state_dir"


def root(host_vars: Mapping[str, object]) -> str:
    return str(host_vars.get(ROOT_VAR) or DEFAULT_ROOT).rstrip("/") or "/"


def state_dir(host_vars: Mapping[str, object]) -> str:
    return str(host_vars.get(STATE_VAR) or DEFAULT_STATE_DIR).rstrip("/") or "/"


def cache_dir(host_vars: Mapping[str, object]) -> str:
    """Drift's and the overlay's file-hash caches."""
    return f"{state_dir(host_vars)}/cache"


def overlays_dir(host_vars: Mapping[str, object]) -> str:
    """`venv overlay`'s journals (inflight-*.json) and manifests, which drift reads."""
    return f"{state_dir(host_vars)}/overlays"


def wheelhouse_dir(host_vars: Mapping[str, object]) -> str:
    """Where `venv create --wheelhouse` keeps wheels on the host: host var ``fleetctl_wheelhouse``
    (a folder that may already hold them, e.g. a cache shared by the machine's checkouts: a wheel
    found there with the right hash is not uploaded), else ``fleetctl_state_dir``/wheelhouse."""
    chosen = host_vars.get("fleetctl_wheelhouse")
    if chosen:
        return str(chosen).rstrip("/")
    return f"{state_dir(host_vars)}/wheelhouse"


def service_dir(host_vars: Mapping[str, object]) -> str:
    """The built-in supervisor's pid and log files."""
    return f"{state_dir(host_vars)}/service"
