"""Shell completion of what an operator types most: host patterns (hosts and groups of the
inventory), release ids and run ids (from the run journals beside the inventory).

Click asks these while the shell completes (``_FLEETCTL_COMPLETE=bash_source fleetctl``): nothing
here contacts a host, and a completion never fails: an inventory that cannot be read completes
nothing rather than print an error into the shell's line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import click
from click.shell_completion import CompletionItem

from fleetctl.cli.context import AppContext, LoginOptions

# A host pattern's last part is what is being typed: 'gpu:!ct1' completes 'ct1'; the operators stay.
_PATTERN_SPLIT = re.compile(r"^(.*[,:])?([!&~]?)([^,:!&~]*)$")
# <name>-<version>-<hash8>, and .b<fingerprint8> for a build made again after its base changed.
_RELEASE_ID = re.compile(r"(?<![\w.-])[A-Za-z0-9][A-Za-z0-9._-]*-[0-9a-f]{8}(?:\.b[0-9a-f]{8})?(?![\w.-])")


def _app(ctx: click.Context) -> AppContext:
    """The options given so far (the group's callback does not run while the shell completes)."""
    from fleetctl.config import find_config, load_config

    params = ctx.find_root().params
    login = LoginOptions(None, None, False, None, False, tuple(params.get("vault_password_files") or ()),
                         tuple(params.get("vault_ids") or ()), False)
    return AppContext(tuple(params.get("inventory_paths") or ()), None, 32, False, 0, {}, 600.0, 0.0, login,
                      load_config(find_config()))


def host_patterns(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Hosts and groups for the part of a pattern being typed (``-l gpu:!ct<TAB>``)."""
    match = _PATTERN_SPLIT.match(incomplete)
    if match is None:
        return []
    head, operator, word = match.group(1) or "", match.group(2), match.group(3)
    try:
        inventory = _app(ctx).inventory
        names = [*sorted(inventory.groups), *inventory.hosts]
    except Exception:  # noqa: BLE001 - completion prints nothing rather than an error into the shell
        return []
    return [CompletionItem(head + operator + n) for n in dict.fromkeys(names) if n.startswith(word)]


def host_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """One inventory host (``drift --baseline``, ``venv overlay --from``)."""
    try:
        hosts = list(_app(ctx).inventory.hosts)
    except Exception:  # noqa: BLE001
        return []
    return [CompletionItem(h) for h in hosts if h.startswith(incomplete)]


def _journals(ctx: click.Context) -> list[Path]:
    from fleetctl.runs.journal import runs_dir

    try:
        folder = runs_dir(_app(ctx).inventory.folder)
        return sorted(folder.glob("*.jsonl"), reverse=True)  # newest first: ids begin with the time
    except Exception:  # noqa: BLE001
        return []


def run_ids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The runs journaled beside the inventory, newest first (``runs show``, ``run --resume``)."""
    return [CompletionItem(p.stem) for p in _journals(ctx) if p.stem.startswith(incomplete)]


def release_ids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Release ids the run journals name (deploys, rollbacks, the releases recorded before a rollout),
    newest first (``rollback --to``, ``releases remove``)."""
    seen: dict[str, None] = {}
    for path in _journals(ctx):
        for rid in _ids_in(path):
            if rid.startswith(incomplete):
                seen.setdefault(rid)
    return [CompletionItem(r) for r in seen]


def _ids_in(path: Path) -> Iterator[str]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        yield from (m.group(0) for text in _strings(event) for m in _RELEASE_ID.finditer(text))


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
