"""Resuming a run as it was journaled: the same playbook, host limit and ``-e`` variables.

A resume that planned with other variables or another limit would roll out another release, or to
hosts that were never part of the run; so the run's own are restored from its ``run_start`` event,
and a command line that contradicts them is refused in one line. Values the journal masks (secrets)
cannot be restored from it: the operator gives them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fleetctl.errors import InputError
from fleetctl.secrets import MASK


def restored(run_id: str, start: Mapping[str, Any], playbook: Path, limit: str | None,
             extra_vars: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The limit and variables to resume ``run_id`` with (``start``: its run_start event)."""
    ran = start.get("playbook")
    if ran and Path(ran).resolve() != playbook.resolve():
        raise InputError(f"run {run_id} ran {ran}, not {playbook}")
    was_limit = start.get("limit")
    if limit is not None and limit != was_limit:
        raise InputError(f"run {run_id} ran with -l {was_limit or '(none)'}, not -l {limit}: resume it without "
                         "-l (the run's own limit is used)")
    was: dict[str, Any] = dict(start.get("extra_vars") or {})
    for key, value in extra_vars.items():
        if key not in was:
            raise InputError(f"run {run_id} ran without -e {key} (its -e: {', '.join(sorted(was)) or 'none'}); "
                             "resume it without new variables")
        if was[key] != value and MASK not in str(was[key]):
            raise InputError(f"run {run_id} ran with -e {key}={was[key]!r}, not {value!r}")
    hidden = sorted(k for k, v in was.items() if MASK in str(v) and k not in extra_vars)
    if hidden:
        raise InputError(f"run {run_id}: the journal masks -e {', '.join(hidden)} (a secret): give "
                         f"{'it' if len(hidden) == 1 else 'them'} again with -e")
    return was_limit, {**was, **extra_vars}


def command(sources: list[Any], playbook: Path, run_id: str, masked: list[str]) -> str:
    """The resume command to print: the run's limit and variables come back by themselves, except
    those the journal masks."""
    given = "".join(f" -e {k}=..." for k in masked)
    return f"fleetctl {' '.join(f'-i {s}' for s in sources)} run {playbook} --resume {run_id}{given}"
