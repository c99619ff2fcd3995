"""A playbook file read and checked before anything runs.

A playbook is a list of plays; a play names its hosts, its rollout (``serial`` steps, failure
budgets, ``on_failure``) and its tasks; a task is one module with its arguments plus ``when``,
``register``, ``tags``, ``ignore_errors`` and ``retries``/``delay``/``until``. Every problem (an
unknown key, a wrong type, an unknown module, a bad template) is one line naming file:line:key.
Arguments that are templates are type-checked again once rendered, on each host.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fleetctl import yamlfile
from fleetctl.playbook import fqcn
from fleetctl.playbook.modules import MODULES, Module, asyncjobs
from fleetctl.templating import TemplateProblem, check_expression, check_syntax, is_template

TASK_KEYS = ("name", "when", "register", "tags", "ignore_errors", "retries", "delay", "until", "become",
             "become_user", "delegate_to", "run_once", "loop", "with_items", "loop_control", "notify",
             "changed_when", "failed_when", "no_log", "environment", "args", "listen", "vars", "check_mode",
             "async", "poll")
BLOCK_KEYS = ("block", "rescue", "always", "name", "when", "tags", "become", "become_user", "delegate_to",
              "run_once", "check_mode")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
