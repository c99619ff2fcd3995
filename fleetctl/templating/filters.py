"""The Jinja2 filters and lookups Ansible playbooks lean on, with Ansible's behaviour.

Filters: ``regex_replace``, ``regex_search``, ``combine`` (``recursive``, ``list_merge``),
``dict2items``/``items2dict``, ``from_json``, ``to_yaml``/``to_nice_yaml``, ``from_yaml``,
``b64encode``/``b64decode``, ``ternary``, ``default``/``d`` (``default(omit)`` drops the argument:
``OMIT`` is the placeholder the runner strips), ``to_nice_json``, ``mandatory``.
Lookups: ``lookup('env', NAME, ...)`` (empty text when unset, as Ansible) and
``lookup('file', PATH, ...)`` (a controller file: absolute, or found under the role's ``files/``,
the role, the playbook's ``files/``, the playbook's folder; trailing newline stripped, as Ansible;
a vault-encrypted file is decrypted). ``query``/``q`` are the list forms.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, TemplateRuntimeError, Undefined, pass_context
from jinja2.runtime import Context

OMIT = "__omit_place_holder__fleetctl"  # the value of ``omit``: an argument holding it is left out


class FilterError(TemplateRuntimeError):
    """A filter or lookup refused its input: a template error like any other (file:line, the host)."""


def _compile(pattern: str, flags: int) -> re.Pattern[str]:
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise FilterError(f"bad regular expression {pattern!r}: {exc}") from None


def _regex_flags(ignorecase: bool, multiline: bool) -> int:
    return (re.I if ignorecase else 0) | (re.M if multiline else 0)


def regex_replace(value: Any, pattern: str = "", replacement: str = "", ignorecase: bool = False,
                  multiline: bool = False, count: int = 0) -> str:
    return _compile(pattern, _regex_flags(ignorecase, multiline)).sub(replacement, str(value), count=count)


def regex_search(value: Any, pattern: str, *groups: str, ignorecase: bool = False,
                 multiline: bool = False) -> Any:
    """The match (or the named/numbered groups asked for, as ``'\\1'``/``'\\g<name>'``); None without one."""
    match = _compile(pattern, _regex_flags(ignorecase, multiline)).search(str(value))
    if match is None:
        return None
    if not groups:
        return match.group(0)
    out = []
    for group in groups:
        g = re.fullmatch(r"\\(\d+)|\\g<(\w+)>", group)
        if g is None:
            raise FilterError(f"regex_search: unknown group argument {group!r} (use '\\\\1' or '\\\\g<name>')")
        out.append(match.group(int(g.group(1)) if g.group(1) else g.group(2)))
    return out


def _merge(a: dict[str, Any], b: Mapping[str, Any], recursive: bool, list_merge: str) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        old = out.get(key)
        if recursive and isinstance(old, Mapping) and isinstance(value, Mapping):
            out[key] = _merge(dict(old), value, recursive, list_merge)
        elif isinstance(old, list) and isinstance(value, list) and list_merge != "replace":
            out[key] = {"keep": old, "append": old + value, "prepend": value + old,
                        "append_rp": [x for x in old if x not in value] + value,
                        "prepend_rp": value + [x for x in old if x not in value]}[list_merge]
        else:
            out[key] = value
    return out


def combine(*dicts: Any, recursive: bool = False, list_merge: str = "replace") -> dict[str, Any]:
    if list_merge not in ("replace", "keep", "append", "prepend", "append_rp", "prepend_rp"):
        raise FilterError(f"combine: unknown list_merge {list_merge!r}")
    out: dict[str, Any] = {}
    for d in dicts:
        for one in d if isinstance(d, list) else [d]:
            if not isinstance(one, Mapping):
                raise FilterError(f"combine: expects mappings, got {type(one).__name__}")
            out = _merge(out, one, recursive, list_merge)
    return out


def dict2items(value: Any, key_name: str = "key", value_name: str = "value") -> list[dict[str, Any]]:
    if not isinstance(value, Mapping):
        raise FilterError(f"dict2items: expects a mapping, got {type(value).__name__}")
    return [{key_name: k, value_name: v} for k, v in value.items()]


def items2dict(value: Any, key_name: str = "key", value_name: str = "value") -> dict[Any, Any]:
    try:
        return {item[key_name]: item[value_name] for item in value}
    except (KeyError, TypeError) as exc:
        raise FilterError(f"items2dict: each item needs {key_name!r} and {value_name!r} ({exc})") from None


def from_json(value: Any) -> Any:
    try:
        return json.loads(str(value))
    except ValueError as exc:
        raise FilterError(f"from_json: {exc}") from None


def from_yaml(value: Any) -> Any:
    try:
        return yaml.safe_load(str(value))
    except yaml.YAMLError as exc:
        raise FilterError(f"from_yaml: {' '.join(str(exc).split())}") from None


def to_yaml(value: Any, indent: int = 2, **kwargs: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=kwargs.pop("default_flow_style", None), indent=indent,
                          allow_unicode=True, sort_keys=kwargs.pop("sort_keys", True), width=kwargs.pop("width", 80))


def to_nice_yaml(value: Any, indent: int = 4, **kwargs: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=False, indent=indent, allow_unicode=True,
                          sort_keys=kwargs.pop("sort_keys", True), width=kwargs.pop("width", 80))


def to_nice_json(value: Any, indent: int = 4, sort_keys: bool = True) -> str:
    return json.dumps(value, indent=indent, sort_keys=sort_keys, separators=(",", ": "))


def b64encode(value: Any, encoding: str = "utf-8") -> str:
    return base64.b64encode(str(value).encode(encoding)).decode("ascii")


def b64decode(value: Any, encoding: str = "utf-8") -> str:
    try:
        return base64.b64decode(str(value), validate=False).decode(encoding)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FilterError(f"b64decode: {exc}") from None


def ternary(value: Any, true_val: Any, false_val: Any, none_val: Any = None) -> Any:
    if value is None and none_val is not None:
        return none_val
    return true_val if value else false_val


def default(value: Any, default_value: Any = "", boolean: bool = False) -> Any:
    """Ansible's (and Jinja2's) ``default``: the fallback when undefined (or falsy, with ``boolean``)."""
    if isinstance(value, Undefined) or (boolean and not value):
        return default_value
    return value


def mandatory(value: Any, msg: str | None = None) -> Any:
    if isinstance(value, Undefined):
        raise FilterError(msg or "mandatory variable not defined")
    return value


def search_paths(variables: Mapping[str, Any], sub: str) -> list[Path]:
    """Where a relative controller path is looked for: the role's ``sub/`` and folder, then the
    playbook's ``sub/`` and folder (Ansible's order)."""
    out: list[Path] = []
    for key in ("role_path", "playbook_dir"):
        base = variables.get(key)
        if isinstance(base, str) and base:
            out += [Path(base) / sub, Path(base)]
    return out


def find_file(name: str, variables: Mapping[str, Any], sub: str = "files") -> Path | None:
    path = Path(name).expanduser()
    if path.is_absolute():
        return path if path.is_file() else None
    return next((p / name for p in search_paths(variables, sub) if (p / name).is_file()), None)


def _lookup_file(context: Context, name: str) -> str:
    from fleetctl.vault import Vault, is_encrypted

    path = find_file(str(name), {key: context.get(key) for key in ("role_path", "playbook_dir")})
    if path is None:
        raise FilterError(f"lookup('file'): {name} not found (looked in the role's files/, the playbook's "
                          "files/ and folder)")
    data = path.read_bytes()
    if is_encrypted(data):
        vault = context.get("__vault")
        data = (vault if isinstance(vault, Vault) else Vault()).decrypt(data.decode("ascii", "replace"), str(path))
        vaulted = True
    else:
        vaulted = False
    try:
        text = data.decode("utf-8").rstrip("\n")
    except UnicodeDecodeError:
        raise FilterError(f"lookup('file'): {path} is not UTF-8 text") from None
    redact = context.get("__redact")
    if vaulted and hasattr(redact, "learn"):  # a secret from now on, in every output and the journal
        redact.learn([text, *(line for line in text.splitlines() if line.strip())])
    return text


def _lookup_values(context: Context, plugin: str, terms: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    names = [t for term in terms for t in (term if isinstance(term, list) else [term])]
    if plugin == "env":
        fallback = kwargs.get("default", "")
        return [os.environ.get(str(n), fallback) for n in names]
    if plugin == "file":
        return [_lookup_file(context, str(n)) for n in names]
    raise FilterError(f"lookup({plugin!r}): not supported (fleetctl has the env and file lookups)")


@pass_context
def lookup(context: Context, plugin: str, *terms: Any, **kwargs: Any) -> Any:
    """``lookup``: the values joined by commas (Ansible's default), or the list with ``wantlist=True``."""
    wantlist = bool(kwargs.pop("wantlist", False))
    values = _lookup_values(context, plugin, terms, kwargs)
    if wantlist:
        return values
    return ",".join(str(v) for v in values) if len(values) != 1 else values[0]


@pass_context
def query(context: Context, plugin: str, *terms: Any, **kwargs: Any) -> list[Any]:
    return _lookup_values(context, plugin, terms, kwargs)


FILTERS = {"regex_replace": regex_replace, "regex_search": regex_search, "combine": combine,
           "dict2items": dict2items, "items2dict": items2dict, "from_json": from_json, "from_yaml": from_yaml,
           "to_yaml": to_yaml, "to_nice_yaml": to_nice_yaml, "to_nice_json": to_nice_json,
           "b64encode": b64encode, "b64decode": b64decode, "ternary": ternary, "default": default, "d": default,
           "mandatory": mandatory}


def install(env: Environment) -> None:
    env.filters.update(FILTERS)
    env.globals.update(lookup=lookup, query=query, q=query, omit=OMIT)


def strip_omitted(value: Any) -> Any:
    """Module arguments with every key whose value is ``omit`` left out (in nested mappings too)."""
    if isinstance(value, dict):
        return {k: strip_omitted(v) for k, v in value.items() if v != OMIT}
    if isinstance(value, list):
        return [strip_omitted(v) for v in value if v != OMIT]
    return value
