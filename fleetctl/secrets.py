"""Secrets never reach output: variables named in a host's ``secret_vars`` list are masked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MASK = "********"


def secret_names(host_vars: Mapping[str, Any]) -> set[str]:
    names = host_vars.get("secret_vars") or []
    return {str(n) for n in names} if isinstance(names, list | tuple) else {str(names)}


def masked(host_vars: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the vars with every secret's value replaced by the mask."""
    names = secret_names(host_vars)
    return {k: (MASK if k in names and v is not None else v) for k, v in host_vars.items()}
