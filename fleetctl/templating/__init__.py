"""Jinja2 for playbooks and release specs: every string is a template, rendered with StrictUndefined.

A string that is one expression (``"{{ ports }}"``) keeps its type (a list stays a list), as in
Ansible; anything else renders to text. ``when``/``until``/``that`` are bare expressions.
Variables are templated lazily and recursively, as Ansible does: a value that is itself a template
(``model_path: "{{ models_root }}/qwen"`` in group_vars) is rendered when a template reads it, with the
same variables (``LazyVars``); a reference loop is one error naming the variable. Text from a host
(registered results, facts: ``unsafe``) and vault-decrypted values are never rendered; a variable
rendered from a vault value is a vault value itself (a secret, masked).
A few filters and tests users of Ansible reach for: ``quote`` (shell quoting), ``to_json``,
``bool``, ``basename`` (Ansible's others in ``filters.py``); ``is version(...)``,
``is failed|succeeded|changed|skipped``, ``is search(regex)``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from typing import Any, cast

from jinja2 import Environment, StrictUndefined, Template, TemplateError, Undefined
from jinja2.nativetypes import NativeEnvironment, NativeTemplate, native_concat
from packaging.version import InvalidVersion, Version

from fleetctl.vault import VaultStr


class TemplateProblem(Exception):
    """A template that does not parse or does not render; the caller adds file:line."""


class VariableProblem(TemplateProblem):
    """A variable's own template does not render (or refers back to itself); names that variable."""


class Unsafe(str):
    """Text that is never rendered as a template (Ansible's unsafe text): what a host answered."""

    __slots__ = ()


def unsafe(value: Any) -> Any:
    """``value`` with every string in it (lists and mappings too) marked never to be rendered."""
    if isinstance(value, str):
        return value if isinstance(value, Unsafe | VaultStr) else Unsafe(value)
    if isinstance(value, list | tuple):
        return [unsafe(v) for v in value]
    if isinstance(value, dict):
        return {k: unsafe(v) for k, v in value.items()}
    return value


def truthy(value: Any) -> bool:
    """A condition's verdict, as Ansible reads it: the strings yes/true/on/1 are true."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on", "y")
    return bool(value)


_OPS = {"<": "__lt__", "lt": "__lt__", "<=": "__le__", "le": "__le__", ">": "__gt__", "gt": "__gt__",
        ">=": "__ge__", "ge": "__ge__", "==": "__eq__", "eq": "__eq__", "!=": "__ne__", "ne": "__ne__"}


def _version_test(value: Any, other: Any, op: str = "==") -> bool:
    if op not in _OPS:
        raise TemplateProblem(f"version test: unknown operator {op!r}")
    try:
        return bool(getattr(Version(str(value)), _OPS[op])(Version(str(other))))
    except InvalidVersion as exc:
        raise TemplateProblem(f"version test: {exc}") from None


def _result_flag(key: str, want: bool = True) -> Any:
    def test(value: Any) -> bool:
        return isinstance(value, Mapping) and bool(value.get(key)) is want
    return test


def _concat(values: Iterable[Any]) -> Any:
    """Native types (numbers, lists, booleans), but a string stays the text the template made: Jinja's
    own concat would literal_eval it too, so a value holding quotes lost them (`'a'"b"` became `ab`)."""
    parts = list(values)
    out = native_concat(parts)
    if isinstance(out, str):
        return parts[0] if len(parts) == 1 else "".join(str(v) for v in parts)
    return out


class _Environment(NativeEnvironment):
    concat = staticmethod(_concat)


class _Template(NativeTemplate):
    environment_class = _Environment


_Environment.template_class = _Template


@lru_cache(maxsize=1)
def environment() -> NativeEnvironment:
    env = _Environment(undefined=StrictUndefined, keep_trailing_newline=True)
    _extend(env)
    return env


@lru_cache(maxsize=1)
def text_environment() -> Environment:
    """For whole files: text in, text out (native types would turn a JSON file into a repr). A block
    tag's newline is dropped (``trim_blocks``), as Ansible's template module does."""
    env = Environment(undefined=StrictUndefined, keep_trailing_newline=True, autoescape=False, trim_blocks=True)
    _extend(env)
    return env


def _extend(env: Environment) -> None:
    from fleetctl.templating import filters

    filters.install(env)  # Ansible's filters and lookups (regex_replace, combine, lookup('env'), ...)
    env.filters.update(quote=lambda v: shlex.quote(str(v)), to_json=lambda v: json.dumps(v, sort_keys=True),
                       bool=truthy, basename=lambda v: os.path.basename(str(v)),
                       dirname=lambda v: os.path.dirname(str(v)))
    env.tests.update(version=_version_test, failed=_result_flag("failed"), failure=_result_flag("failed"),
                     succeeded=_result_flag("failed", False), success=_result_flag("failed", False),
                     changed=_result_flag("changed"), skipped=_result_flag("skipped"),
                     search=lambda v, pattern: re.search(pattern, str(v)) is not None,
                     match=lambda v, pattern: re.match(pattern, str(v)) is not None)


def is_template(text: str) -> bool:
    return ("{{" in text or "{%" in text) and not isinstance(text, Unsafe | VaultStr)


def has_template(value: Any) -> bool:
    """A template anywhere in ``value`` (plain lists and dicts are looked into, other mappings not)."""
    if isinstance(value, str):
        return is_template(value)
    if isinstance(value, list | tuple):
        return any(has_template(v) for v in value)
    if isinstance(value, dict):
        return any(has_template(v) for v in value.values())
    return False


class LazyVars(Mapping[str, Any]):
    """Variables as a template reads them: a value holding a template is rendered on first read
    (and kept for this rendering), with these same variables; Jinja's globals (``lookup``, ``range``)
    are found too. One instance serves one rendering, in one thread."""

    def __init__(self, raw: Mapping[str, Any], globals_: Mapping[str, Any] | None = None) -> None:
        self.raw = raw
        self.globals = environment().globals if globals_ is None else globals_
        self._done: dict[str, Any] = {}
        self._reading: list[str] = []
        self.secret = False  # a vault value was read: what is rendered from it is a secret too

    def __getitem__(self, key: str) -> Any:
        if key in self._done:
            return self._done[key]
        if key not in self.raw:
            return self.globals[key]
        value = self.raw[key]
        if not has_template(value):
            self.secret = self.secret or _has_vault(value)
            return value
        if key in self._reading:
            chain = " -> ".join([*self._reading[self._reading.index(key):], key])
            raise VariableProblem(f"variable {key!r} refers back to itself ({chain})")
        self._reading.append(key)
        was_secret, self.secret = self.secret, False
        try:
            out = _render_lazy(value, self)
        except VariableProblem:
            raise
        except TemplateProblem as exc:
            raise VariableProblem(f"variable {key!r}: {exc}") from None
        finally:
            self._reading.pop()
        if self.secret and isinstance(out, str):
            out = VaultStr(out)
        self.secret = self.secret or was_secret
        self._done[key] = out
        return out

    def __contains__(self, key: object) -> bool:
        return key in self.raw or key in self.globals

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def copy(self) -> dict[str, Any]:
        """The raw values, unrendered (Jinja's traceback rewriting copies the context's variables)."""
        return dict(self.raw)


def lazy(variables: Mapping[str, Any]) -> LazyVars:
    return variables if isinstance(variables, LazyVars) else LazyVars(variables)


def _has_vault(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return any(_has_vault(v) for v in value)
    if isinstance(value, dict):
        return any(_has_vault(v) for v in value.values())
    return isinstance(value, VaultStr)


def _run(template: Template, variables: LazyVars) -> Any:
    """Render ``template`` over lazily templated variables (Template.render would copy them into a
    dict, reading, and so rendering, every one)."""
    env = template.environment
    try:
        return env.concat(template.root_render_func(_context(template, variables)))
    except Exception:
        env.handle_exception()


def _context(template: Template, variables: LazyVars) -> Any:
    # shared=True: Jinja reads the mapping as it is (typed dict, any Mapping works) instead of copying it.
    return template.new_context(cast(dict[str, Any], variables), shared=True)


def check_syntax(text: str) -> None:
    """Raise TemplateProblem when ``text`` is not a valid template."""
    if is_template(text):
        try:
            environment().parse(text)
        except TemplateError as exc:
            raise TemplateProblem(f"bad template {text!r}: {exc}") from None


def check_expression(expr: str) -> None:
    try:
        environment().compile_expression(expr)
    except TemplateError as exc:
        raise TemplateProblem(f"bad expression {expr!r}: {exc}") from None


def render(value: Any, variables: Mapping[str, Any]) -> Any:
    """``value`` with every string rendered (recursively through lists and mappings)."""
    return _render_lazy(value, lazy(variables))


def _render_lazy(value: Any, variables: LazyVars) -> Any:
    if isinstance(value, str):
        if not is_template(value):
            return value
        try:
            out = _run(environment().from_string(value), variables)
            if isinstance(out, Undefined):  # native rendering hands a lone undefined back instead of failing
                out._fail_with_undefined_error()
            return out
        except TemplateError as exc:
            raise TemplateProblem(f"{_why(exc)} in {value!r}") from None
    if isinstance(value, list | tuple):
        return [_render_lazy(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: _render_lazy(v, variables) for k, v in value.items()}
    return value


def render_text(text: str, variables: Mapping[str, Any]) -> str:
    """A whole file (the ``template`` module): always text. Raises ``jinja2.TemplateError``, whose
    traceback holds the template's line, so the caller can name file:line."""
    env = text_environment()
    return str(_run(env.from_string(text), LazyVars(variables, env.globals)))


def evaluate(expr: Any, variables: Mapping[str, Any]) -> Any:
    """A bare Jinja2 expression (``when``/``until``/``that``); a bool or non-string is itself."""
    if not isinstance(expr, str):
        return expr
    text = expr.strip()
    if text.startswith("{{") and text.endswith("}}"):  # tolerated, as Ansible does (with a warning there)
        text = text[2:-2]
    try:
        template = environment().compile_expression(text, undefined_to_none=False)._template
        context = _context(template, lazy(variables))
        try:
            for _ in template.root_render_func(context):
                pass
        except Exception:
            environment().handle_exception()
        out = context.vars["result"]
        if isinstance(out, Undefined):
            out._fail_with_undefined_error()
        return out
    except TemplateError as exc:
        raise TemplateProblem(f"{_why(exc)} in {expr!r}") from None


def _why(exc: TemplateError) -> str:
    return f"{type(exc).__name__}: {exc.message or exc}"
