"""group_vars/ and host_vars/ files, and the YAML reading every inventory file shares."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from fleetctl.connection import describe_type, unknown_ansible_var
from fleetctl.errors import InputError, InventoryError
from fleetctl.vault import Vault, VaultError, is_encrypted, mark_secret
from fleetctl.yamlfile import check_expansion

VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")  # Ansible's order: a bare NAME (or NAME/) first

try:
    from yaml import CSafeLoader as _BaseLoader  # libyaml: the inventory is on the startup path
except ImportError:  # pragma: no cover
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]


class VarsLoader(_BaseLoader):
    """Safe YAML plus Ansible's !unsafe and !vault tags (a !vault value is decrypted with the run's
    vault passwords into a VaultStr, a secret)."""

    def __init__(self, stream: str, path: Path | None = None, vault: Vault | None = None) -> None:
        super().__init__(stream)
        self.path = path
        self.vault = vault or Vault()


def _construct_unsafe(loader: VarsLoader, node: yaml.Node) -> Any:
    return loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else None


def _construct_vault(loader: VarsLoader, node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise yaml.constructor.ConstructorError(None, None, "a !vault value must be a text block", node.start_mark)
    try:
        return loader.vault.decrypt_str(str(loader.construct_scalar(node)), f"{loader.path}:{node.start_mark.line + 1}")
    except VaultError as exc:
        raise InventoryError(str(exc)) from None


def decrypt_file_text(path: Path, text: str, vault: Vault | None) -> tuple[str, bool]:
    """(the text, whether it was a vault-encrypted file): a whole encrypted file is decrypted first."""
    if not is_encrypted(text):
        return text, False
    try:
        plain = (vault or Vault()).decrypt(text, f"{path}:1")
    except VaultError as exc:
        raise InventoryError(str(exc)) from None
    try:
        return plain.decode("utf-8"), True
    except UnicodeDecodeError:
        raise InventoryError(f"{path}: the decrypted vault file is not UTF-8 text") from None


VarsLoader.add_constructor("!unsafe", _construct_unsafe)
VarsLoader.add_constructor("!vault", _construct_vault)


def yaml_error(path: Path, exc: yaml.YAMLError) -> InventoryError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc)
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and mark is not None and context_mark.line != mark.line:
        problem = f"{problem} ({context} at line {context_mark.line + 1})"
    return InventoryError(f"{where}: YAML error: {' '.join(str(problem).split())}")


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise InventoryError(f"{path}: is a directory; expected a YAML {what}") from None
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise InventoryError(f"{path}:{line}: not UTF-8 text (byte {exc.object[exc.start]:#04x})") from None
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read {what}: {exc}") from None


def load_vars_file(path: Path, vault: Vault | None = None) -> dict[str, Any]:
    """A vars file (plain, with !vault values, or vault-encrypted whole: then every string is a secret)."""
    text, encrypted = decrypt_file_text(path, read_text(path, "vars file"), vault)
    loader = VarsLoader(text, path, vault)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise yaml_error(path, exc) from None
    finally:
        loader.dispose()
    if encrypted:
        data = mark_secret(data)
    try:
        check_expansion(data, str(path))
    except InputError as exc:
        raise InventoryError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InventoryError(f"{path}: a vars file must be a mapping of variables, got {describe_type(data)}")
    return data


class VarsDir:
    """group_vars/ or host_vars/: NAME, NAME.yml, NAME.yaml or NAME.json (first found), or a
    folder NAME/ whose files are merged in sorted order, recursively, as Ansible does."""

    def __init__(self, root: Path, kind: str, vault: Vault | None = None) -> None:
        self.root = root
        self.vault = vault
        self.kind = kind  # "group" or "host", for messages
        self.entries = set(os.listdir(root)) if root.is_dir() else set()

    def load(self, name: str) -> dict[str, Any]:
        for ext in VARS_EXTENSIONS:
            if name + ext in self.entries:
                found = self.root / (name + ext)
                files = _dir_files(found) if found.is_dir() else [found]
                break
        else:
            return {}
        merged: dict[str, Any] = {}
        for file in files:
            values = load_vars_file(file, self.vault)
            for key in values:
                why = unknown_ansible_var(str(key))
                if why:
                    raise InventoryError(f"{file}:{_key_line(file, str(key))}: {self.kind} '{name}': {why}")
            merged.update(values)
        return merged


def _key_line(path: Path, key: str) -> int:
    """The line of a top-level key in a vars file (looked up only to name an error)."""
    text = path.read_text(encoding="utf-8")
    if is_encrypted(text):
        return 1
    for number, line in enumerate(text.splitlines(), 1):
        if line.split(":", 1)[0].strip().strip("\"'") == key:
            return number
    return 1


def _dir_files(folder: Path) -> list[Path]:
    files: list[Path] = []
    for entry in sorted(os.listdir(folder)):
        if entry.startswith(".") or entry.endswith("~"):  # hidden files and editor backups
            continue
        full, ext = folder / entry, os.path.splitext(entry)[1]
        if full.is_dir() and not ext:
            files.extend(_dir_files(full))
        elif full.is_file() and ext in VARS_EXTENSIONS:
            files.append(full)
    return files
