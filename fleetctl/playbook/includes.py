"""``include_tasks`` / ``import_tasks``: a file of tasks put in place of the task that names it.

Both are read when the playbook loads (the file name must not be a template), so a problem inside
the file is one line naming that file:line before anything runs. The file is relative to the file
that includes it (a role's ``tasks/`` folder for a role's tasks). The include's ``when``, ``tags``,
``become``/``become_user`` apply to every task of the file, as with a block. Unlike Ansible's
dynamic ``include_tasks``, a ``when`` is evaluated per included task rather than once: the same
answer unless a task of the file changes what the condition reads. ``loop`` on an include is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl import yamlfile
from fleetctl.playbook.schema import Task, TaskOptions, inherit
from fleetctl.templating import is_template

if TYPE_CHECKING:
    from fleetctl.vault import Vault

INCLUDE_KEYS = ("include_tasks", "import_tasks", "name", "when", "tags", "become", "become_user")
MAX_DEPTH = 32
_depth: list[Path] = []  # the files being read now (a file that includes itself is refused)
loading_vault: list[Vault | None] = [None]  # the playbook's vault while it loads (!vault in task files)


def parse_include(doc: yamlfile.YamlDoc, at: tuple[Any, ...], raw: dict[str, Any], flat: list[Task],
                  inherited: dict[str, Any] | None) -> Any:
    from fleetctl.playbook.blocks import Block, parse_item

    key = "include_tasks" if "include_tasks" in raw else "import_tasks"
    for other in raw:
        if other not in INCLUDE_KEYS or (other in ("include_tasks", "import_tasks") and other != key):
            raise doc.error(at + (other,), f"{other}: not supported on {key} (it takes {', '.join(INCLUDE_KEYS[2:])})")
    name = raw[key]
    if isinstance(name, dict) and set(name) == {"file"}:
        name = name["file"]
    if not isinstance(name, str) or not name.strip() or is_template(name):
        raise doc.error(at + (key,), f"{key}: a task file name relative to this file (no template)")
    path = (doc.path.parent / name).resolve()
    if not path.is_file():
        raise doc.error(at + (key,), f"{key}: {path} not found")
    if path in _depth or len(_depth) >= MAX_DEPTH:
        raise doc.error(at + (key,), f"{key}: {name} includes itself (a loop)")
    own = yamlfile.validate_at(doc, at, {k: v for k, v in raw.items() if k != key}, TaskOptions, key)
    options = inherit(own, inherited) if inherited else own
    passed = options.model_dump(include={"when", "tags", "become", "become_user", "delegate_to", "run_once"})
    _depth.append(path)
    try:
        inner = yamlfile.load(path, "task file", loading_vault[0])
        if inner.data is None:
            items: list[Any] = []
        elif not isinstance(inner.data, list):
            raise inner.error((), "a task file is a list of tasks")
        else:
            items = [parse_item(inner, (n,), t, flat, passed) for n, t in enumerate(inner.data)]
    finally:
        _depth.pop()
    return Block(options.name or f"{key} {name}", doc.line_of(at), items)
