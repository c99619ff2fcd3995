"""``roles:`` a play's roles, each a folder ``roles/NAME`` beside the playbook (or a path relative to it).

A role's folder holds ``tasks/main.yml`` (run in the play, before the play's ``tasks``),
``handlers/main.yml`` (the play's handlers, before its own), ``defaults/main.yml`` (below the
inventory), ``vars/main.yml`` (above the play's vars), and the ``files/`` and ``templates/`` where
its ``copy``/``template`` sources and ``lookup('file')`` are found first. An entry is a name or
``{role: NAME, vars: {...}, when, tags, become, become_user}``; other keys are role parameters
(variables, as Ansible). Role dependencies (``meta/main.yml`` ``dependencies``) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl import yamlfile
from fleetctl.errors import FleetError, InputError
from fleetctl.playbook.schema import Task, TaskOptions
from fleetctl.templating import is_template

if TYPE_CHECKING:
    from fleetctl.vault import Vault

ENTRY_KEYS = ("role", "name", "vars", "when", "tags", "become", "become_user")


@dataclass
class Role:
    name: str
    path: Path
    items: list[Any] = field(default_factory=list)
    defaults: dict[str, Any] = field(default_factory=dict)
    vars: dict[str, Any] = field(default_factory=dict)


def _main(folder: Path) -> Path | None:
    return next((folder / n for n in ("main.yml", "main.yaml") if (folder / n).is_file()), None)


def _vars(path: Path | None, vault: Vault | None) -> dict[str, Any]:
    from fleetctl.inventory.vars_files import load_vars_file

    if path is None:
        return {}
    try:
        return load_vars_file(path, vault)
    except FleetError as exc:
        raise InputError(str(exc)) from None


def _entry(doc: yamlfile.YamlDoc, at: tuple[Any, ...], entry: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(name, options for its tasks, its variables)."""
    if isinstance(entry, str):
        return entry, {}, {}
    if not isinstance(entry, dict) or not isinstance(entry.get("role", entry.get("name")), str):
        raise doc.error(at, "roles: each entry is a role name or a mapping with `role`")
    name = entry.get("role", entry.get("name"))
    variables = entry.get("vars") or {}
    if not isinstance(variables, dict):
        raise doc.error(at + ("vars",), "vars: a mapping of variables")
    params = {k: v for k, v in entry.items() if k not in ENTRY_KEYS}
    options = yamlfile.validate_at(doc, at, {k: v for k, v in entry.items() if k in ENTRY_KEYS[3:]}, TaskOptions,
                                   "role")
    passed = options.model_dump(include={"when", "tags", "become", "become_user"}, exclude_defaults=True)
    return str(name), passed, {**params, **variables}


def find_role(doc: yamlfile.YamlDoc, at: tuple[Any, ...], name: str) -> Path:
    if not name.strip() or is_template(name):
        raise doc.error(at, "roles: a role name (no template)")
    base = doc.path.parent
    for candidate in (base / "roles" / name, base / name):
        if candidate.is_dir():
            return candidate.resolve()
    raise doc.error(at, f"roles: role {name!r} not found (looked in {base / 'roles' / name} and {base / name})")


def load_role(doc: yamlfile.YamlDoc, at: tuple[Any, ...], entry: Any, vault: Vault | None, flat: list[Task],
              role_handlers: list[Task]) -> Role:
    from fleetctl.playbook import handlers
    from fleetctl.playbook.blocks import parse_item

    name, passed, params = _entry(doc, at, entry)
    path = find_role(doc, at, name)
    meta = _main(path / "meta")
    if meta is not None:
        deps = (yamlfile.load(meta, "role meta", vault).data or {})
        if isinstance(deps, dict) and deps.get("dependencies"):
            raise InputError(f"{meta}:1: dependencies: role dependencies are not supported (list the roles in "
                             "the play instead)")
    role = Role(name, path, defaults=_vars(_main(path / "defaults"), vault),
                vars={**_vars(_main(path / "vars"), vault), **params})
    first = len(flat)
    tasks_file = _main(path / "tasks")
    if tasks_file is not None:
        tasks = yamlfile.load(tasks_file, "role tasks", vault)
        if tasks.data is not None and not isinstance(tasks.data, list):
            raise tasks.error((), "a role's tasks file is a list of tasks")
        role.items = [parse_item(tasks, (n,), t, flat, passed or None) for n, t in enumerate(tasks.data or [])]
    handlers_file = _main(path / "handlers")
    if handlers_file is not None:
        hdoc = yamlfile.load(handlers_file, "role handlers", vault)
        if hdoc.data is not None and not isinstance(hdoc.data, list):
            raise hdoc.error((), "a role's handlers file is a list of tasks")
        role_handlers += handlers.parse_handlers(hdoc, (), hdoc.data or [], flat)
    for task in flat[first:]:
        task.role_dir = path
    return role
