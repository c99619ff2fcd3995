"""An executable inventory script, run as Ansible's script plugin runs it: ``SCRIPT --list`` gives
groups (``hosts``, ``vars``, ``children``) and ``_meta.hostvars``; without ``_meta``, each host's
vars come from ``SCRIPT --host NAME``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from fleetctl.connection import describe_type, unknown_ansible_var
from fleetctl.errors import InventoryError
from fleetctl.inventory.raw import RawInventory, Refused

SCRIPT_TIMEOUT = 120.0


def is_script(path: Path) -> bool:
    """Executable with a '#!' line (an executable file without one is read as YAML or INI, as Ansible
    ends up doing when its exec fails)."""
    import os

    if not os.access(path, os.X_OK):
        return False
    try:
        with path.open("rb") as fh:
            return fh.read(2) == b"#!"
    except OSError:
        return False


def _run(path: Path, args: list[str]) -> Any:
    what = f"{path} {' '.join(args)}"
    try:
        done = subprocess.run([str(path), *args], capture_output=True, timeout=SCRIPT_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise InventoryError(f"{what}: inventory script ran past {SCRIPT_TIMEOUT:.0f} s") from None
    except OSError as exc:
        raise InventoryError(f"{what}: cannot run inventory script: {exc.strerror or exc}") from None
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no stderr"]
        raise InventoryError(f"{what}: inventory script exited {done.returncode}: {tail[0]}")
    try:
        return json.loads(done.stdout.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f"line {exc.lineno}: " if isinstance(exc, json.JSONDecodeError) else ""
        raise InventoryError(f"{what}: inventory script output is not JSON ({where}{exc})") from None


def parse_script(path: Path, raw: RawInventory) -> None:
    data = _run(path, ["--list"])
    if not isinstance(data, dict):
        raise InventoryError(f"{path} --list: inventory script must print a JSON object, got {describe_type(data)}")
    meta = data.get("_meta")
    hostvars = meta.get("hostvars") if isinstance(meta, dict) else None
    if meta is not None and not isinstance(hostvars, dict):
        raise InventoryError(f"{path} --list: '_meta.hostvars' must be an object, got {describe_type(hostvars)}")
    seen: dict[str, None] = {}
    try:
        for group, body in data.items():
            if group != "_meta":
                _group(path, raw, str(group), body, seen)
    except Refused as exc:
        raise InventoryError(f"{path} --list: {exc}") from None
    for host in seen:
        values = hostvars.get(host, {}) if hostvars is not None else _run(path, ["--host", host])
        what = f"{path} --list: _meta.hostvars" if hostvars is not None else f"{path} --host {host}"
        if not isinstance(values, dict):
            raise InventoryError(f"{what}: host '{host}' vars must be an object, got {describe_type(values)}")
        _check(what, f"host '{host}'", values)
        raw.hosts[host].update(values)


def _check(what: str, owner: str, values: dict[str, Any]) -> None:
    for key in values:
        why = unknown_ansible_var(str(key))
        if why:
            raise InventoryError(f"{what}: {owner}: {why}")


def _group(path: Path, raw: RawInventory, group: str, body: Any, seen: dict[str, None]) -> None:
    raw.add_group(group)
    if not isinstance(body, dict):  # Ansible's old form: a list of hosts
        body = {"hosts": body}
    elif not any(k in body for k in ("hosts", "vars", "children")):  # Ansible: the group is its own host
        body = {"hosts": [group], "vars": body}
    hosts, values, children = body.get("hosts", []), body.get("vars", {}), body.get("children", [])
    for key, value, kind in (("hosts", hosts, list), ("vars", values, dict), ("children", children, list)):
        if not isinstance(value, kind):
            raise Refused(f"'{group}.{key}' must be a{'n object' if kind is dict else ' list'}, "
                          f"got {describe_type(value)}")
    for host in hosts:
        raw.add_host(group, str(host))
        seen[str(host)] = None
    _check(f"{path} --list", f"group '{group}'", values)
    for key, value in values.items():
        raw.set_group_var(group, key, value)
    for child in children:
        raw.link(group, str(child))
