"""``block`` / ``rescue`` / ``always``: tasks grouped so that a failure is handled and cleanup is sure.

As Ansible: the block's tasks run in order on the batch's hosts; a host that fails one of them runs
the ``rescue`` tasks (when there are any); a host whose rescue succeeds is *rescued*: it goes on with
the play and its failure is not counted (the recap says ``rescued``). ``always`` then runs on every
host that entered the block, failed or not (not on an unreachable one), so an undrain at a load
balancer is not skipped when a deploy fails. Ctrl-C inside a block still runs its ``always`` tasks
before the run stops. A block's ``when``, ``tags``, ``become``, ``delegate_to`` and ``run_once``
apply to every task in it (conditions and tags add up; a task's own keywords win).

``include_tasks`` / ``import_tasks``: a file of tasks put in place of the task that names it.

Both are read when the playbook loads (the file name must not be a template), so a problem inside
the file is one line naming that file:line before anything runs. The file is relative to the file
that includes it (a role's ``tasks/`` folder for a role's tasks). The include's ``when``, ``tags``,
``become``/``become_user`` apply to every task of the file, as with a block. Unlike Ansible's
dynamic ``include_tasks``, a ``when`` is evaluated per included task rather than once: the same
answer unless a task of the file changes what the condition reads. ``loop`` on an include is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl import yamlfile
from fleetctl.playbook.schema import BLOCK_KEYS, Task, TaskOptions, inherit, parse_task
from fleetctl.templating import is_template

if TYPE_CHECKING:
    from fleetctl.playbook.handlers import Flush, Notifications
    from fleetctl.playbook.play_schema import Play
    from fleetctl.vault import Vault


@dataclass
class Block:
    name: str
    line: int
    block: list[Any] = field(default_factory=list)  # Task | Block
    rescue: list[Any] = field(default_factory=list)
    always: list[Any] = field(default_factory=list)


Item = Any  # Task | Block | handlers.Flush


class Interrupted(Exception):
    """Ctrl-C seen before ``task``: the run stops once the blocks around it have run their ``always``."""

    def __init__(self, task: Task) -> None:
        super().__init__(task.name)
        self.task = task


def parse_item(doc: yamlfile.YamlDoc, at: tuple[Any, ...], raw: Any, flat: list[Task],
               inherited: dict[str, Any] | None) -> Item:
    """A task, or a block of tasks; every task is appended to ``flat`` (the play's tasks, in order)."""
    from fleetctl.playbook import fqcn, handlers

    raw = fqcn.normalize(doc, at, raw)
    if isinstance(raw, dict) and ("include_tasks" in raw or "import_tasks" in raw):
        return parse_include(doc, at, raw, flat, inherited)
    if isinstance(raw, dict) and "meta" in raw:
        if raw["meta"] != handlers.FLUSH or len(raw) > 2 or (len(raw) == 2 and "name" not in raw):
            raise doc.error(at + ("meta",), f"meta: only `meta: {handlers.FLUSH}` is supported (alone in its task)")
        return handlers.Flush([], doc.line_of(at))  # the play fills in its handlers
    if not isinstance(raw, dict) or "block" not in raw:
        task = parse_task(doc, at, raw, len(flat), inherited)
        flat.append(task)
        return task
    for key in raw:
        if key not in BLOCK_KEYS:
            raise doc.error(at + (key,), f"{key}: not a block key (a block has {', '.join(BLOCK_KEYS)}); "
                                         "put the module in a task inside `block`")
    own = yamlfile.validate_at(doc, at, {k: v for k, v in raw.items() if k not in ("block", "rescue", "always")},
                               TaskOptions, "block")
    options = inherit(own, inherited) if inherited else own
    passed = options.model_dump(include={"when", "tags", "become", "become_user", "delegate_to", "run_once",
                                         "check_mode"})
    out = Block(options.name or f"block at line {doc.line_of(at)}", doc.line_of(at))
    for part in ("block", "rescue", "always"):
        items = raw.get(part) or []
        if not isinstance(items, list) or (part == "block" and not items):
            raise doc.error(at + (part,), f"{part}: a list of tasks" + (" (at least one)" if part == "block" else ""))
        setattr(out, part, [parse_item(doc, at + (part, k), t, flat, passed) for k, t in enumerate(items)])
    return out


def select(items: list[Item], keep: Callable[[Task], bool]) -> list[Item]:
    """The items whose tasks ``keep`` keeps (in order); a block left with no task is dropped."""
    out: list[Item] = []
    for item in items:
        if isinstance(item, Task):
            if keep(item):
                out.append(item)
            continue
        if not isinstance(item, Block):  # a flush point stays
            out.append(item)
            continue
        parts = {p: select(getattr(item, p), keep) for p in ("block", "rescue", "always")}
        if parts["block"] or parts["always"]:
            out.append(Block(item.name, item.line, parts["block"], parts["rescue"], parts["always"]))
    return out


def count(items: list[Item]) -> int:
    return sum(1 if isinstance(i, Task) else count(i.block) + count(i.rescue) + count(i.always)
               if isinstance(i, Block) else 0 for i in items)


RunTask = Callable[[Task, list[str]], list[str]]  # a task on hosts -> the hosts that failed it


class Executor:
    """Runs a batch's items on its hosts. ``run_task`` runs one task and says who failed; ``stopping``
    says Ctrl-C was pressed; ``reachable`` whether a host can still be asked; ``rescued(host)`` takes
    a rescued host's failure out of the recap."""

    def __init__(self, play: Play, run_task: RunTask, stopping: Callable[[], bool],
                 reachable: Callable[[str], bool], rescued: Callable[[str], None],
                 notifications: Notifications | None = None) -> None:
        self.notifications = notifications
        self.play = play
        self.run_task = run_task
        self.stopping = stopping
        self.reachable = reachable
        self.rescued = rescued

    def run(self, items: list[Item], active: list[str], failed: list[str], cleanup: bool = False) -> None:
        """``items`` on ``active`` (in place: a host that fails moves from ``active`` to ``failed``)."""
        for item in items:
            if not active:
                return
            if isinstance(item, Block):
                self.block(item, active, failed, cleanup)
                continue
            if not isinstance(item, Task):
                self.flush(item, active, failed)
                continue
            if self.stopping() and not cleanup:
                raise Interrupted(item)
            for host in self.run_task(item, list(active)):
                active.remove(host)
                failed.append(host)
            if failed and self.play.model.any_errors_fatal and not cleanup:
                return

    def flush(self, flush: Flush, active: list[str], failed: list[str]) -> None:
        if self.notifications is not None:
            self.notifications.run(flush, active, failed, self.run_task)

    def block(self, block: Block, active: list[str], failed: list[str], cleanup: bool) -> None:
        entered = list(active)
        broke: list[str] = []
        stop: Interrupted | None = None
        try:
            self.run(block.block, active, broke, cleanup)
            if broke and block.rescue:
                rescuing = [h for h in broke if self.reachable(h)]
                still: list[str] = []
                self.run(block.rescue, rescuing, still, cleanup)
                for host in rescuing:  # rescued: back in the play, its failure forgiven
                    broke.remove(host)
                    self.rescued(host)
                active[:] = [h for h in entered if h in active or h in rescuing]
        except Interrupted as exc:  # Ctrl-C: the cleanup still runs (a deadline or bad input does not)
            stop = exc
        failed += [h for h in broke if h not in failed]
        if block.always:
            self._always(block, entered, active, failed)
        if stop is not None:
            raise stop

    def _always(self, block: Block, entered: list[str], active: list[str], failed: list[str]) -> None:
        """Every host that entered the block, failed or not, that can still be reached."""
        hosts = [h for h in entered if (h in active or h in failed) and self.reachable(h)]
        ok = [h for h in hosts if h in active]
        lost: list[str] = []
        going = list(hosts)
        self.run(block.always, going, lost, cleanup=True)
        for host in lost:
            if host in ok:
                active.remove(host)
                failed.append(host)


# -- include_tasks / import_tasks --------------------------------------------------------------------

INCLUDE_KEYS = ("include_tasks", "import_tasks", "name", "when", "tags", "become", "become_user")
MAX_DEPTH = 32
_depth: list[Path] = []  # the files being read now (a file that includes itself is refused)
loading_vault: list[Vault | None] = [None]  # the playbook's vault while it loads (!vault in task files)


def parse_include(doc: yamlfile.YamlDoc, at: tuple[Any, ...], raw: dict[str, Any], flat: list[Task],
                  inherited: dict[str, Any] | None) -> Any:
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
