"""YAML files whose errors name ``file:line``: release specs, playbooks, kernel manifests.

``load(path)`` parses with a safe loader that records the line of every mapping key, and
``validate(path, doc, Model)`` checks the document against a pydantic model, turning the first
problem into one ``InputError`` line that names the file, the line and the key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from fleetctl.errors import InputError

if TYPE_CHECKING:
    from fleetctl.vault import Vault

M = TypeVar("M")


class _LineLoader(yaml.SafeLoader):
    def __init__(self, stream: str, path: Path | None = None, vault: Vault | None = None) -> None:
        super().__init__(stream)
        self.path = path
        self.vault = vault
        self.key_lines: dict[int, dict[Any, int]] = {}
        self.item_lines: dict[int, list[int]] = {}


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> Iterator[dict[Any, Any]]:
    data: dict[Any, Any] = {}
    yield data
    no_duplicate_keys(loader, node)
    data.update(loader.construct_mapping(node, deep=True))
    loader.key_lines[id(data)] = {loader.construct_object(k): k.start_mark.line + 1 for k, _ in node.value}


def _construct_seq(loader: _LineLoader, node: yaml.SequenceNode) -> Iterator[list[Any]]:
    data: list[Any] = []
    yield data
    data.extend(loader.construct_sequence(node, deep=True))
    loader.item_lines[id(data)] = [item.start_mark.line + 1 for item in node.value]


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)

def no_duplicate_keys(loader: Any, node: yaml.MappingNode) -> None:
    """A key given twice in one mapping is an error naming its line (YAML keeps the last silently)."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        try:
            key = loader.construct_object(key_node)
            first = seen.setdefault(key, key_node.start_mark.line + 1)
        except TypeError:  # an unhashable key: reported where it is used
            continue
        if first != key_node.start_mark.line + 1:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first given at line {first})", key_node.start_mark)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


def _construct_vault(loader: _LineLoader, node: yaml.Node) -> Any:
    """Ansible's !vault value, decrypted with the run's vault into a secret (vault.VaultStr)."""
    from fleetctl.vault import Vault

    where = f"{loader.path}:{node.start_mark.line + 1}"
    if not isinstance(node, yaml.ScalarNode):
        raise InputError(f"{where}: a !vault value must be a text block")
    return (loader.vault or Vault()).decrypt_str(str(loader.construct_scalar(node)), where)


_LineLoader.add_constructor("!vault", _construct_vault)


MAX_EXPANDED = 1_000_000  # values a document may hold once its aliases are expanded


def expanded_size(data: Any, limit: int = MAX_EXPANDED) -> int:
    """How many values ``data`` holds with every YAML alias expanded (counted once per reference, in
    time linear in the distinct objects); stops counting past ``limit``."""
    memo: dict[int, int] = {}

    def size(node: Any) -> int:
        if not isinstance(node, dict | list):
            return 1
        if id(node) not in memo:
            memo[id(node)] = 0  # a recursive alias counts as itself once
            children = list(node.values()) if isinstance(node, dict) else node
            total = 1
            for child in children:
                total += size(child)
                if total > limit:
                    break
            memo[id(node)] = total
        return memo[id(node)]

    return size(data)


def check_expansion(data: Any, where: str) -> None:
    """A "billion laughs" document (aliases of aliases) is refused before anything walks it."""
    if expanded_size(data) > MAX_EXPANDED:
        raise InputError(f"{where}: YAML aliases expand to more than {MAX_EXPANDED} values; refused")


@dataclass
class YamlDoc:
    path: Path
    data: Any
    key_lines: dict[int, dict[Any, int]] = field(default_factory=dict)
    item_lines: dict[int, list[int]] = field(default_factory=dict)
    start_line: int = 1

    def line_of(self, loc: tuple[Any, ...]) -> int:
        """The line of the deepest part of ``loc`` (a path of keys and list indexes) that exists."""
        line, node = self.start_line, self.data
        for part in loc:
            if isinstance(node, Mapping) and part in node:
                line = self.key_lines.get(id(node), {}).get(part, line)
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                lines = self.item_lines.get(id(node), [])
                line = lines[part] if part < len(lines) else line
                node = node[part]
            else:
                break
        return line

    def error(self, loc: tuple[Any, ...], message: str) -> InputError:
        return InputError(f"{self.path}:{self.line_of(loc)}: {message}")


def load(path: Path, what: str, vault: Vault | None = None) -> YamlDoc:
    """Parse ``path``; a missing file or a YAML syntax error is one line naming file:line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: not UTF-8 text (byte {exc.object[exc.start]:#04x})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what}: {exc}") from None
    loader = _LineLoader(text, path, vault)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{where}: YAML error: {' '.join(str(problem).split())}") from None
    finally:
        loader.dispose()
    start = node.start_mark.line + 1 if node is not None else 1
    check_expansion(data, str(path))
    return YamlDoc(path, data, loader.key_lines, loader.item_lines, start)


def validate(doc: YamlDoc, model: type[M], what: str) -> M:
    """``model`` (a pydantic model) from the document; the first error names file:line and key."""
    return validate_at(doc, (), doc.data, model, what)


def validate_at(doc: YamlDoc, at: tuple[Any, ...], data: Any, model: type[M], what: str) -> M:
    """``model`` from the part of the document at ``at`` (a path of keys and indexes)."""
    from pydantic import ValidationError

    if not isinstance(data, Mapping):
        raise doc.error(at, f"a {what} must be a mapping of keys, got {type(data).__name__}")
    try:
        return model.model_validate(data)  # type: ignore[attr-defined]
    except ValidationError as exc:
        raise first_error(doc, at, exc) from None


def first_error(doc: YamlDoc, at: tuple[Any, ...], exc: Any, prefix: str = "") -> InputError:
    """The first pydantic error of ``exc`` as one line naming file:line and the key."""
    first = exc.errors()[0]
    loc = tuple(first["loc"])
    key = prefix + (".".join(str(p) for p in loc) or "(top level)")
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    elif first["type"] == "missing":
        message = "required key missing"
    return doc.error(at + loc, f"{key}: {message}")
