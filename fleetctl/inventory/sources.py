"""Which inventory sources there are and how each is read, as ansible-core's InventoryManager
decides: several ``-i``, a directory (every file in it, sorted, Ansible's ignored names skipped,
recursively), an executable script, a YAML file, an INI file, or a ``host1,host2`` list."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fleetctl.errors import InventoryError
from fleetctl.inventory.build import build, vars_roots
from fleetctl.inventory.ini_source import parse_ini
from fleetctl.inventory.model import Inventory
from fleetctl.inventory.raw import RawInventory
from fleetctl.inventory.script_source import is_script, parse_script
from fleetctl.inventory.vars_files import decrypt_file_text, read_text
from fleetctl.inventory.yaml_source import parse_yaml
from fleetctl.patterns import split_host_port
from fleetctl.vault import Vault

YAML_EXTENSIONS = (".yml", ".yaml", ".json")
# Ansible's IGNORED: hidden names, the vars folders, and INVENTORY_IGNORE_EXTS (REJECT_EXTS + 3).
_IGNORED_EXTS = (".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".cfg", ".retry")
IGNORED = re.compile("|".join([r"^\.", "^host_vars$", "^group_vars$", "^vars_plugins$",
                               *(re.escape(e) + "$" for e in _IGNORED_EXTS)]))


def env_sources(value: str) -> list[str]:
    """The sources FLEETCTL_INVENTORY names: a list split on ',' (as Ansible's ANSIBLE_INVENTORY) or ':'."""
    return [p.strip() for p in re.split(r"[,:]", value) if p.strip()]


def _is_host_list(source: str) -> bool:
    return "," in source and not os.path.exists(source)


def load_inventory(path: str | Path | Sequence[str | Path],
                   extra_vars: Mapping[str, Any] | None = None, vault: Vault | None = None) -> Inventory:
    """Load one inventory source or several (later sources add to and override earlier ones), with
    group_vars/ and host_vars/ beside each file source and inside each directory source."""
    from fleetctl.connection import unknown_ansible_var

    for key in extra_vars or {}:
        why = unknown_ansible_var(str(key))
        if why:
            raise InventoryError(f"-e {key}: {why}")
    given = [path] if isinstance(path, str | Path) else list(path)
    if not given:
        raise InventoryError("no inventory: pass -i PATH or set FLEETCTL_INVENTORY")
    raw = RawInventory()
    files: list[Path] = []
    for source in given:
        if isinstance(source, str) and _is_host_list(source):
            _parse_host_list(source, raw)
            continue
        source_path = Path(source)
        _parse_source(source_path, raw, vault, top=True)
        files.append(source_path)
    raw.reconcile()
    return build(files, vars_roots(files), raw, extra_vars or {}, vault)


def _parse_source(path: Path, raw: RawInventory, vault: Vault | None, top: bool = False) -> int:
    """Read one source into ``raw``; returns how many files it read."""
    if path.is_dir():
        count = sum(_parse_source(path / e, raw, vault) for e in sorted(os.listdir(path)) if not IGNORED.search(e))
        if top and not count:
            raise InventoryError(f"{path}: no inventory file in this directory (Ansible's ignored names "
                                 "skipped: hidden, group_vars, host_vars, *.md, *.txt, *.cfg, ...)")
        return count
    if top and not path.exists():
        raise InventoryError(f"{path}: inventory file not found")
    if is_script(path):
        parse_script(path, raw)
        return 1
    ext = path.suffix.lower() if path.suffix else ""
    if ext == ".toml":
        raise InventoryError(f"{path}: TOML inventories are not supported (use YAML or INI)")
    if ext in YAML_EXTENSIONS:
        parse_yaml(path, raw, vault=vault)
        return 1
    text, encrypted = decrypt_file_text(path, read_text(path, "inventory file"), vault)
    if not ext and _reads_as_yaml(path, text):
        parse_yaml(path, raw, text, vault, secret=encrypted)
        return 1
    parse_ini(path, raw, text, secret=encrypted)  # an encrypted file's values are secrets, as in YAML
    return 1


def _reads_as_yaml(path: Path, text: str) -> bool:
    """A file without extension is YAML when it parses as a YAML mapping (Ansible tries its yaml
    plugin before its ini plugin on such files)."""
    from fleetctl.inventory.yaml_source import read_yaml_inventory

    try:
        data, _, _ = read_yaml_inventory(path, text)
    except InventoryError:
        return False
    return isinstance(data, dict)


def _parse_host_list(source: str, raw: RawInventory) -> None:
    """Ansible's host_list plugin: 'a,b:2222,' puts each host into 'ungrouped'."""
    for item in source.split(","):
        item = item.strip()
        if item and item not in raw.hosts:
            name, port = split_host_port(item)
            raw.add_host("ungrouped", name, port)
