"""A play's structure, as Ansible lays it out, turned into one body of items that run in order.

``import_playbook`` splices another playbook's plays in (its path relative to the importing file).
In a play: ``gather_facts: true`` first (the ``facts`` module, named "Gathering Facts"), then
``pre_tasks`` (handlers flushed), the ``roles`` (roles.py) and ``tasks`` (handlers flushed), then
``post_tasks`` (handlers flushed). ``vars_files`` (relative to the playbook; plain, with ``!vault``
values, or vault-encrypted whole) are read when the playbook loads and sit above play ``vars``;
roles' ``vars`` above those, roles' ``defaults`` below the inventory.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl import yamlfile
from fleetctl.errors import FleetError, InputError
from fleetctl.playbook import blocks, fqcn, handlers, roles
from fleetctl.playbook.modules import MODULES
from fleetctl.playbook.play_schema import Play, Playbook, PlayModel
from fleetctl.playbook.schema import Task, TaskOptions, _check_templates
from fleetctl.templating import is_template

if TYPE_CHECKING:
    import hashlib

    from fleetctl.vault import Vault

MAX_IMPORT_DEPTH = 16
_IMPORT_KEYS = ("import_playbook", "name")


def load_playbook(path: Path, vault: Vault | None = None) -> Playbook:
    """Read and check ``path``; the first problem raises InputError naming file:line."""
    digest = hashlib.sha256()
    found = load_plays(path, vault, digest)
    for n, play in enumerate(found):  # imported playbooks' plays are numbered in running order
        play.index = n
        for task in [*play.tasks, *play.handlers]:
            task.play = n
    return Playbook(path, found, digest.hexdigest())


def _play(doc: yamlfile.YamlDoc, i: int, raw: Any, vault: Vault | None = None) -> Play:
    model = yamlfile.validate_at(doc, (i,), raw, PlayModel, "play")
    _check_templates(doc, (i, "vars"), model.vars)
    play = build_play(doc, i, model, vault)
    if model.on_failure != "halt" and not play.has_module("release"):
        raise doc.error((i, "on_failure"), f"on_failure: {model.on_failure} rolls back releases, and this play "
                                           "has no `release` task")
    return play


def load_plays(path: Path, vault: Vault | None, digest: hashlib._Hash, depth: int = 0,
               seen: tuple[Path, ...] = ()) -> list[Play]:
    """Every play of ``path``, imported playbooks' plays in their place."""
    blocks.loading_vault[0] = vault
    doc = yamlfile.load(path, "playbook", vault)
    digest.update(path.read_bytes())
    if not isinstance(doc.data, list) or not doc.data:
        raise doc.error((), "a playbook is a non-empty list of plays")
    out: list[Play] = []
    for i, raw in enumerate(doc.data):
        raw = fqcn.normalize(doc, (i,), raw)
        if isinstance(raw, dict) and "import_playbook" in raw:
            out += _imported(doc, i, raw, vault, digest, depth, (*seen, path.resolve()))
            continue
        play = _play(doc, i, raw, vault)
        play.source = path
        out.append(play)
    return out


def _imported(doc: yamlfile.YamlDoc, i: int, raw: dict[str, Any], vault: Vault | None, digest: hashlib._Hash,
              depth: int, seen: tuple[Path, ...]) -> list[Play]:
    for key in raw:
        if key not in _IMPORT_KEYS:
            raise doc.error((i, key), f"{key}: not supported on import_playbook (it takes {', '.join(_IMPORT_KEYS)})")
    name = raw["import_playbook"]
    if not isinstance(name, str) or not name.strip() or is_template(name):
        raise doc.error((i, "import_playbook"), "import_playbook: a playbook file name (no template)")
    target = (doc.path.parent / name).resolve()
    if target in seen or depth >= MAX_IMPORT_DEPTH:
        raise doc.error((i, "import_playbook"), f"import_playbook: {name} imports itself (a loop)")
    if not target.is_file():
        raise doc.error((i, "import_playbook"), f"import_playbook: {target} not found")
    return load_plays(target, vault, digest, depth + 1, seen)


def build_play(doc: yamlfile.YamlDoc, i: int, model: PlayModel, vault: Vault | None) -> Play:
    """The play's items in running order, its handlers, its vars from files and roles."""
    flat: list[Task] = []
    play_handlers: list[Task] = []
    more_vars = _vars_files(doc, i, model, vault)
    defaults: dict[str, Any] = {}
    body: list[Any] = []
    if model.gather_facts:
        body.append(_gather_facts(doc, i, flat))
    body += _items(doc, (i, "pre_tasks"), model.pre_tasks, flat)
    if model.pre_tasks:
        body.append(handlers.Flush(play_handlers, doc.line_of((i, "pre_tasks"))))
    role_handlers: list[Task] = []
    for r, entry in enumerate(model.roles):
        role = roles.load_role(doc, (i, "roles", r), entry, vault, flat, role_handlers)
        body += role.items
        defaults.update(role.defaults)
        more_vars.update(role.vars)
    body += _items(doc, (i, "tasks"), model.tasks, flat)
    body.append(handlers.Flush(play_handlers, doc.line_of((i, "tasks"))))
    body += _items(doc, (i, "post_tasks"), model.post_tasks, flat)
    if model.post_tasks:
        body.append(handlers.Flush(play_handlers, doc.line_of((i, "post_tasks"))))
    play_handlers += role_handlers
    play_handlers += handlers.parse_handlers(doc, (i, "handlers"), model.handlers, flat)
    handlers.check_notified(flat, play_handlers, doc)
    handlers.attach(body, play_handlers)
    for task in flat:  # the play's tags are every task's (facts gathering is Ansible's `always`)
        own = ["always"] if task.module.name == "facts" and task.name == "Gathering Facts" else task.options.tags
        task.options = task.options.model_copy(update={"tags": [*model.tags, *own]})
    play = Play(i, model, flat, doc.line_of((i,)), body, play_handlers, defaults, more_vars)
    # Tasks run around a rollback (drain, undrain: playbook/releases.py), not in the play's body.
    play.rollback_hooks = {part: _items(doc, (i, part), getattr(model, part), flat)
                           for part in ("before_rollback", "after_rollback")}
    return play


def _items(doc: yamlfile.YamlDoc, at: tuple[Any, ...], raw: list[Any], flat: list[Task]) -> list[Any]:
    return [blocks.parse_item(doc, (*at, j), t, flat, None) for j, t in enumerate(raw)]


def _gather_facts(doc: yamlfile.YamlDoc, i: int, flat: list[Task]) -> Task:
    task = Task(i, len(flat), "Gathering Facts", MODULES["facts"], {}, TaskOptions(), doc.line_of((i, "gather_facts")),
                doc.path)
    flat.append(task)
    return task


def _vars_files(doc: yamlfile.YamlDoc, i: int, model: PlayModel, vault: Vault | None) -> dict[str, Any]:
    from fleetctl.inventory.vars_files import load_vars_file

    out: dict[str, Any] = {}
    for n, name in enumerate(model.vars_files):
        at = (i, "vars_files", n)
        if not isinstance(name, str) or is_template(name):
            raise doc.error(at, "vars_files: a file name relative to the playbook (no template)")
        path = doc.path.parent / name
        if not path.is_file():
            raise doc.error(at, f"vars_files: {path} not found")
        try:
            out.update(load_vars_file(path, vault))
        except FleetError as exc:
            raise InputError(str(exc)) from None
    return out
