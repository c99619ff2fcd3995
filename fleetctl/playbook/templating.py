"""Jinja2 for playbooks: every string is a template, rendered with StrictUndefined.

A string that is one expression (``"{{ ports }}"``) keeps its type (a list stays a list), as in
Ansible; anything else renders to text. ``when``/``until``/``that`` are bare expressions.
A few filters and tests users of Ansible reach for: ``quote`` (shell quoting), ``to_json``,
``bool``, ``basename`` (Ansible's others in ``filters.py``); ``is version(...)``,
``is failed|succeeded|changed|skipped``, ``is search(regex)``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from jinja2 import Environment, StrictUndefined, TemplateError, Undefined
from jinja2.nativetypes import NativeEnvironment, NativeTemplate, native_concat
from packaging.version import InvalidVersion, Version


class TemplateProblem(Exception):
    """A template that does not parse or does not render; the caller adds file:line."""


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
    from fleetctl.playbook import filters

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
    return "{{" in text or "{%" in text


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
    if isinstance(value, str):
        if not is_template(value):
            return value
        try:
            out = environment().from_string(value).render(variables)
            if isinstance(out, Undefined):  # native rendering hands a lone undefined back instead of failing
                out._fail_with_undefined_error()
            return out
        except TemplateError as exc:
            raise TemplateProblem(f"{_why(exc)} in {value!r}") from None
    if isinstance(value, list):
        return [render(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: render(v, variables) for k, v in value.items()}
    return value


def render_text(text: str, variables: Mapping[str, Any]) -> str:
    """A whole file (the ``template`` module): always text. Raises ``jinja2.TemplateError``, whose
    traceback holds the template's line, so the caller can name file:line."""
    return text_environment().from_string(text).render(variables)


def evaluate(expr: Any, variables: Mapping[str, Any]) -> Any:
    """A bare Jinja2 expression (``when``/``until``/``that``); a bool or non-string is itself."""
    if not isinstance(expr, str):
        return expr
    text = expr.strip()
    if text.startswith("{{") and text.endswith("}}"):  # tolerated, as Ansible does (with a warning there)
        text = text[2:-2]
    try:
        out = environment().compile_expression(text, undefined_to_none=False)(**variables)
        if isinstance(out, Undefined):
            out._fail_with_undefined_error()
        return out
    except TemplateError as exc:
        raise TemplateProblem(f"{_why(exc)} in {expr!r}") from None


def _why(exc: TemplateError) -> str:
    return f"{type(exc).__name__}: {exc.message or exc}"
