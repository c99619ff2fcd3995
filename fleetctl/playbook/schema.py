"""A playbook file read and checked before anything runs.

A playbook is a list of plays; a play names its hosts, its rollout (``serial`` steps, failure
budgets, ``on_failure``) and its tasks; a task is one module with its arguments plus ``when``,
``register``, ``tags``, ``ignore_errors`` and ``retries``/``delay``/``until``. Every problem (an
unknown key, a wrong type, an unknown module, a bad template) is one line naming file:line:key.
Arguments that are templates are type-checked again once rendered, on each host.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fleetctl import yamlfile
from fleetctl.playbook import fqcn
from fleetctl.playbook.approval import Approval
from fleetctl.playbook.modules import MODULES, Module, asyncjobs
from fleetctl.templating import TemplateProblem, check_expression, check_syntax, is_template
from fleetctl.vault import Vault

TASK_KEYS = ("name", "when", "register", "tags", "ignore_errors", "retries", "delay", "until", "become",
             "become_user", "delegate_to", "run_once", "loop", "with_items", "loop_control", "notify",
             "changed_when", "failed_when", "no_log", "environment", "args", "listen", "vars", "check_mode",
             "async", "poll")
BLOCK_KEYS = ("block", "rescue", "always", "name", "when", "tags", "become", "become_user", "delegate_to",
              "run_once", "check_mode")
OnFailure = Literal["halt", "rollback_failed", "rollback_all"]
_STEP = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_step(step: int | str) -> int | str:
    if isinstance(step, bool):
        raise ValueError("a serial step is a host count or a percentage such as '25%'")
    if isinstance(step, int):
        if step < 1:
            raise ValueError(f"a serial step must be at least 1 host, got {step}")
        return step
    if step.strip().isdigit():
        return _check_step(int(step))
    m = _STEP.match(step)
    if not m or not 0 < float(m.group(1)) <= 100:
        raise ValueError(f"a serial step is a host count or a percentage in (0, 100], got {step!r}")
    return step.strip()


class PlayModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = ""
    hosts: str
    tags: list[str] = Field(default_factory=list)  # every task of the play has them too
    vars: dict[str, Any] = Field(default_factory=dict)
    serial: list[int | str] | None = None  # a single step is read as a list of one
    # A host variable naming each host's multi-node group: batches never split a group.
    serial_group_var: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    max_fail_percentage: float | None = Field(default=None, ge=0, le=100)
    max_failures: int | None = Field(default=None, ge=0)
    any_errors_fatal: bool = False
    pause_between_batches: float = Field(default=0.0, ge=0)
    on_failure: OnFailure = "halt"
    become: bool | None = None  # Ansible's keyword: beats -b, loses to the inventory's ansible_become
    become_user: str | None = None
    # Soak and capacity (playbook/capacity.py): the health re-checked after each batch's pause, a floor
    # of hosts serving, a deadline for the whole play's rollout.
    recheck_after_pause: bool = True
    min_healthy: int | str | None = None
    progress_deadline: float | None = Field(default=None, gt=0)
    # Approval and rollback hooks (playbook/approval.py, playbook/releases.py).
    approval: Approval | None = None
    before_rollback: list[Any] = Field(default_factory=list)
    after_rollback: list[Any] = Field(default_factory=list)
    tasks: list[Any] = Field(default_factory=list)
    # Ansible's play structure (playbook/plays.py): facts first, vars files, roles, handlers.
    gather_facts: bool = False  # fleetctl's default: facts are opt-in (they cost a round of probes)
    vars_files: list[str] = Field(default_factory=list)
    pre_tasks: list[Any] = Field(default_factory=list)
    roles: list[Any] = Field(default_factory=list)
    post_tasks: list[Any] = Field(default_factory=list)
    handlers: list[Any] = Field(default_factory=list)

    @field_validator("tags", mode="before")
    @classmethod
    def _one_tag(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("vars_files", mode="before")
    @classmethod
    def _one_file(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("min_healthy", mode="before")
    @classmethod
    def _floor(cls, value: Any) -> Any:
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        if isinstance(value, str) and _STEP.match(value):
            return value.strip()
        raise ValueError("min_healthy is a host count (>= 0) or a percentage such as '75%'")

    @field_validator("serial", mode="before")
    @classmethod
    def _steps(cls, value: Any) -> Any:
        if value is None:
            return None
        steps = value if isinstance(value, list) else [value]
        if not steps:
            raise ValueError("serial: give at least one step")
        return [_check_step(s) for s in steps]


Condition = bool | str | list[bool | str] | None


class LoopControl(BaseModel):
    model_config = ConfigDict(extra="forbid")

    loop_var: str = "item"
    index_var: str | None = None
    label: str | None = None

    @field_validator("loop_var", "index_var")
    @classmethod
    def _var(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError(f"needs a variable name, got {value!r}")
        return value


class TaskOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str | None = None
    when: bool | str | list[bool | str] | None = None
    register_as: str | None = Field(default=None, alias="register")
    tags: list[str] = Field(default_factory=list)
    ignore_errors: bool = False
    retries: int = Field(default=3, ge=0)
    delay: float = Field(default=5.0, ge=0)
    until: str | None = None
    become: bool | None = None  # None: the play's
    become_user: str | None = None
    delegate_to: str | None = None  # an inventory host or localhost (playbook/delegation.py)
    run_once: bool = False  # once per batch, on its first host still going; the result is every host's
    # playbook/loops.py, handlers.py, outcome.py
    loop: str | list[Any] | None = None
    with_items: str | list[Any] | None = None
    loop_control: LoopControl | None = None
    notify: list[str] = Field(default_factory=list)
    listen: list[str] = Field(default_factory=list)  # handlers only
    changed_when: Condition = None
    failed_when: Condition = None
    no_log: bool = False
    environment: dict[str, str | int | float | bool] = Field(default_factory=dict)
    vars: dict[str, Any] = Field(default_factory=dict)  # the task's own variables (above the play's)
    check_mode: bool | None = None  # true: always a dry run; false: runs for real under --check (Ansible's)
    async_: int | None = Field(default=None, alias="async", gt=0)  # modules/asyncjobs.py: a detached host job
    poll: int | None = Field(default=None, ge=0)  # its check interval (None: 15 s); 0: not waited for

    @field_validator("tags", "notify", "listen", mode="before")
    @classmethod
    def _one_tag(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @property
    def loop_items(self) -> str | list[Any] | None:
        return self.loop if self.loop is not None else self.with_items

    @property
    def changed_when_list(self) -> list[bool | str]:
        return _listed(self.changed_when)

    @property
    def failed_when_list(self) -> list[bool | str]:
        return _listed(self.failed_when)

    @field_validator("register_as")
    @classmethod
    def _identifier(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError(f"register needs a variable name, got {value!r}")
        return value


@dataclass
class Task:
    play: int
    index: int
    name: str
    module: Module
    args: dict[str, Any]
    options: TaskOptions
    line: int
    source: Path | None = None  # the file the task is written in (an included file, a role's tasks)
    role_dir: Path | None = None  # a role's task: its folder (files/, templates/ are looked up there)

    @property
    def when(self) -> list[bool | str]:
        w = self.options.when
        return [] if w is None else list(w) if isinstance(w, list) else [w]

    def where(self, path: Path) -> str:
        return f"{self.source or path}:{self.line}"


@dataclass
class Play:
    index: int
    model: PlayModel
    tasks: list[Task]  # every task, those inside blocks included, in order
    line: int
    body: list[Any] = field(default_factory=list)  # Task | blocks.Block | handlers.Flush, as run
    handlers: list[Task] = field(default_factory=list)  # in definition order (roles' first)
    defaults: dict[str, Any] = field(default_factory=dict)  # roles' defaults: below the inventory
    more_vars: dict[str, Any] = field(default_factory=dict)  # vars_files, then roles' vars: above play vars
    source: Path | None = None
    rollback_hooks: dict[str, list[Any]] = field(default_factory=dict)  # before_rollback / after_rollback items

    @property
    def vars(self) -> dict[str, Any]:
        """The play's variables in the order they are rendered: vars, vars_files, roles' vars."""
        return {**self.model.vars, **self.more_vars}

    @property
    def name(self) -> str:
        return self.model.name or f"play {self.index + 1} ({self.model.hosts})"

    def has_module(self, name: str) -> bool:
        return any(t.module.name == name for t in self.tasks)


@dataclass
class Playbook:
    path: Path
    plays: list[Play]
    digest: str = ""
    errors: list[str] = field(default_factory=list)

    def tasks(self) -> Iterator[Task]:
        for play in self.plays:
            yield from play.tasks


def load_playbook(path: Path, vault: Vault | None = None) -> Playbook:
    """Read and check ``path``; the first problem raises InputError naming file:line."""
    from fleetctl.playbook import plays

    digest = hashlib.sha256()
    found = plays.load_plays(path, vault, digest)
    for n, play in enumerate(found):  # imported playbooks' plays are numbered in running order
        play.index = n
        for task in [*play.tasks, *play.handlers]:
            task.play = n
    return Playbook(path, found, digest.hexdigest())


def _play(doc: yamlfile.YamlDoc, i: int, raw: Any, vault: Vault | None = None) -> Play:
    from fleetctl.playbook import plays

    model = yamlfile.validate_at(doc, (i,), raw, PlayModel, "play")
    _check_templates(doc, (i, "vars"), model.vars)
    play = plays.build_play(doc, i, model, vault)
    if model.on_failure != "halt" and not play.has_module("release"):
        raise doc.error((i, "on_failure"), f"on_failure: {model.on_failure} rolls back releases, and this play "
                                           "has no `release` task")
    return play


def parse_task(doc: yamlfile.YamlDoc, at: tuple[Any, ...], raw: Any, index: int,
               inherited: dict[str, Any] | None = None) -> Task:
    """One task at ``at``; ``inherited``: its blocks' options (when, tags, become, delegate_to...)."""
    i, j = at[0], at[-1]
    raw = fqcn.normalize(doc, at, raw)
    raw = _local_action(doc, at, raw)
    raw = _merge_args(doc, at, raw)
    if not isinstance(raw, dict):
        raise doc.error(at, f"tasks[{j}]: a task is a mapping (a module and its options), got {type(raw).__name__}")
    modules = [k for k in raw if k not in TASK_KEYS]
    if not modules:
        raise doc.error(at, f"tasks[{j}]: no module in this task (modules: {', '.join(sorted(MODULES))})")
    for key in modules:
        if key not in MODULES:
            hint = difflib.get_close_matches(str(key), [*MODULES, *TASK_KEYS], n=1)
            raise doc.error(at + (key,), f"{key}: unknown module or task key"
                                         + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    if len(modules) > 1:
        raise doc.error(at + (modules[1],), f"{modules[1]}: a task runs one module; this one also has {modules[0]!r}")
    name = modules[0]
    mod = MODULES[name]
    options = yamlfile.validate_at(doc, at, {k: v for k, v in raw.items() if k in TASK_KEYS}, TaskOptions, "task")
    if inherited:
        options = inherit(options, inherited)
    if mod.run_once:  # pause: once per batch, whatever the task says
        options = options.model_copy(update={"run_once": True})
    args = _module_args(doc, at, mod, raw[name])
    if problem := asyncjobs.load_problem(name, options):
        raise doc.error(at + (problem[0],), problem[1])
    for key, value in (("name", options.name), ("until", options.until)):
        if value is not None:
            _check_one(doc, at + (key,), value, expression=key == "until")
    for cond in ([options.when] if not isinstance(options.when, list) else options.when):
        if isinstance(cond, str):
            _check_one(doc, at + ("when",), cond, expression=True)
    if options.until is not None and options.register_as is None:
        raise doc.error(at + ("until",), "until: needs `register` to name the result it tests")
    for key in ("changed_when", "failed_when"):
        for cond in _listed(getattr(options, key)):
            if isinstance(cond, str):
                _check_one(doc, at + (key,), cond, expression=True)
    if isinstance(options.loop_items, str):
        _check_one(doc, at + ("loop" if options.loop is not None else "with_items",), options.loop_items, False)
    if options.loop is not None and options.with_items is not None:
        raise doc.error(at + ("with_items",), "with_items: a task has one loop; this one also has `loop`")
    if options.listen and not (inherited or {}).get("handler"):
        raise doc.error(at + ("listen",), "listen: only a handler listens (put the task under `handlers`)")
    label = options.name or f"{name} {_short(args)}".strip()
    return Task(i, index, label, mod, args, options, doc.line_of(at), doc.path)


def inherit(options: TaskOptions, parent: dict[str, Any]) -> TaskOptions:
    """A block's options on a task inside it: conditions and tags add up, the task's own keywords win."""
    parent = {k: v for k, v in parent.items() if k != "handler"}
    when = [*_listed(parent.get("when")), *_listed(options.when)]
    update: dict[str, Any] = {"when": when or None, "tags": [*parent.get("tags", []), *options.tags]}
    for key in ("become", "become_user", "delegate_to", "check_mode"):
        if getattr(options, key) is None and parent.get(key) is not None:
            update[key] = parent[key]
    if parent.get("run_once"):
        update["run_once"] = True
    return options.model_copy(update=update)


def _listed(value: Any) -> list[Any]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def _merge_args(doc: yamlfile.YamlDoc, at: tuple[Any, ...], raw: Any) -> Any:
    """``args: {...}`` beside the module: its keys join the module's own (the module's win), as Ansible."""
    if not isinstance(raw, dict) or "args" not in raw:
        return raw
    extra = raw["args"]
    if not isinstance(extra, dict):
        raise doc.error(at + ("args",), "args: a mapping of the module's arguments")
    modules = [k for k in raw if k not in TASK_KEYS]
    rest = {k: v for k, v in raw.items() if k != "args"}
    if len(modules) == 1 and (isinstance(raw[modules[0]], dict) or raw[modules[0]] is None):
        rest[modules[0]] = {**extra, **(raw[modules[0]] or {})}
    elif len(modules) == 1 and MODULES.get(modules[0]) and MODULES[modules[0]].free_form:
        rest[modules[0]] = {**extra, MODULES[modules[0]].free_form: raw[modules[0]]}
    return rest


def _local_action(doc: yamlfile.YamlDoc, at: tuple[Any, ...], raw: Any) -> Any:
    """``local_action: {module: uri, url: ...}`` is ``uri: {url: ...}`` with ``delegate_to: localhost``."""
    if not isinstance(raw, dict) or "local_action" not in raw:
        return raw
    action = raw["local_action"]
    if not isinstance(action, dict) or not isinstance(action.get("module"), str):
        raise doc.error(at + ("local_action",), "local_action: a mapping with `module` and that module's arguments")
    if "delegate_to" in raw:
        raise doc.error(at + ("delegate_to",), "delegate_to: a local_action already runs on localhost")
    rest = {k: v for k, v in raw.items() if k != "local_action"}
    args = {k: v for k, v in action.items() if k != "module"}
    return {**rest, action["module"]: args or None, "delegate_to": "localhost"}


def _module_args(doc: yamlfile.YamlDoc, at: tuple[Any, ...], mod: Module, raw: Any) -> dict[str, Any]:
    where = at + (mod.name,)
    if raw is None:
        args: dict[str, Any] = {}
    elif isinstance(raw, dict):
        args = raw
    elif isinstance(raw, str | int | float | list) and mod.free_form:
        args = {mod.free_form: raw}
    else:
        raise doc.error(where, f"{mod.name}: arguments must be a mapping of keys")
    _check_templates(doc, where, args, expressions=getattr(mod.args, "expressions", ()))
    try:
        mod.args.model_validate(args)
    except ValidationError as exc:
        # A template's value is only known on the host: those fields are checked again once rendered.
        real = [e for e in exc.errors() if not _is_template_at(args, e["loc"])]
        if real:
            raise yamlfile.first_error(doc, where, _Errors(real), prefix=f"{mod.name}.") from None
    return args


class _Errors:
    def __init__(self, errors: list[Any]) -> None:
        self._errors = errors

    def errors(self) -> list[Any]:
        return self._errors


def _is_template_at(args: Any, loc: tuple[Any, ...]) -> bool:
    node = args
    for part in loc:
        if isinstance(node, str):
            break
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return False
    return isinstance(node, str) and is_template(node)


def _check_templates(doc: yamlfile.YamlDoc, at: tuple[Any, ...], value: Any,
                     expressions: tuple[str, ...] = ()) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _check_templates(doc, at + (k,), v) if k not in expressions else _check_exprs(doc, at + (k,), v)
    elif isinstance(value, list):
        for n, v in enumerate(value):
            _check_templates(doc, at + (n,), v)
    elif isinstance(value, str):
        _check_one(doc, at, value, expression=False)


def _check_exprs(doc: yamlfile.YamlDoc, at: tuple[Any, ...], value: Any) -> None:
    for n, v in enumerate(value if isinstance(value, list) else [value]):
        if isinstance(v, str):
            _check_one(doc, at + ((n,) if isinstance(value, list) else ()), v, expression=True)


def _check_one(doc: yamlfile.YamlDoc, at: tuple[Any, ...], text: str, expression: bool) -> None:
    try:
        check_expression(text) if expression else check_syntax(text)
    except TemplateProblem as exc:
        parts = [str(p) for p in at if not isinstance(p, int)]
        key = ".".join(parts[1:] if parts[:1] == ["tasks"] else parts) or "template"
        raise doc.error(at, f"{key}: {exc}") from None


def _short(args: dict[str, Any]) -> str:
    text = " ".join(f"{v}" if len(args) == 1 else f"{k}={v}" for k, v in args.items())
    return text if len(text) <= 60 else text[:57] + "..."
