"""The project config file: ``fleetctl.cfg`` or an Ansible ``ansible.cfg``, the same INI format.

An Ansible user's ``ansible.cfg`` in the current folder is honoured, as ``ansible`` does. Only the
first file found is read (Ansible's rule), in this order:

    $FLEETCTL_CONFIG, $ANSIBLE_CONFIG, ./fleetctl.cfg, ./ansible.cfg, ~/.fleetctl.cfg, ~/.ansible.cfg

``FLEETCTL_CONFIG=none`` (or an empty file) reads none. Precedence of each setting:
command line > environment variable > config file > built-in default.

Keys, in ``[defaults]`` (the become keys in ``[privilege_escalation]`` too, as Ansible has them):
inventory, remote_user, private_key_file, forks, vault_password_file, become, become_user.
Paths are relative to the config file's folder. In ``fleetctl.cfg`` an unknown key or section is an
input error naming file:line; an ``ansible.cfg`` holds many keys for Ansible alone, so those are
reported in one warning line naming each file:line, and the run goes on.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from fleetctl.errors import InputError

KEYS = ("inventory", "remote_user", "private_key_file", "forks", "vault_password_file", "become", "become_user")
PATH_KEYS = ("inventory", "private_key_file", "vault_password_file")
SECTIONS = {"defaults": KEYS, "privilege_escalation": ("become", "become_user")}
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}
_SECTION = re.compile(r"^\[([^\]]+)\]\s*$")


@dataclass
class ProjectConfig:
    path: Path | None = None
    values: dict[str, str] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # "file:line: key" of keys fleetctl does not read

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def flag(self, key: str) -> bool:
        value = self.values.get(key)
        return value is not None and value.strip().lower() in _TRUE

    def forks(self) -> int | None:
        return int(self.values["forks"]) if "forks" in self.values else None

    def warning(self) -> str | None:
        if not self.unknown:
            return None
        return f"{self.path}: keys fleetctl does not use (left to Ansible): {', '.join(self.unknown)}"


def find_config(cwd: Path | None = None, home: Path | None = None) -> Path | None:
    """The config file this run reads, or None."""
    for var in ("FLEETCTL_CONFIG", "ANSIBLE_CONFIG"):
        named = os.environ.get(var)
        if named:
            if named.lower() == "none":
                return None
            path = Path(named).expanduser()
            if not path.is_file():
                raise InputError(f"{var}={named}: no such file")
            return path
    cwd = cwd or Path.cwd()
    home = home or Path.home()
    for path in (cwd / "fleetctl.cfg", cwd / "ansible.cfg", home / ".fleetctl.cfg", home / ".ansible.cfg"):
        if path.is_file():
            return path
    return None


def load_config(path: Path | None) -> ProjectConfig:
    if path is None:
        return ProjectConfig()
    strict = path.name.endswith("fleetctl.cfg")
    config = ProjectConfig(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the config file: {exc}") from None
    section: str | None = None
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        where = f"{path}:{number}"
        if not line or line[0] in "#;":
            continue
        if m := _SECTION.match(line):
            section = m.group(1).strip()
            if strict and section not in SECTIONS:
                raise InputError(f"{where}: unknown section [{section}] (known: defaults, privilege_escalation)")
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or section is None:
            raise InputError(f"{where}: expected 'key = value' inside a [section]")
        if key not in SECTIONS.get(section, ()):
            if strict:
                raise InputError(f"{where}: unknown key {key!r} (known: {', '.join(KEYS)})")
            config.unknown.append(f"{path.name}:{number}: {key}")
            continue
        config.values[key] = _check(key, _strip_comment(value), where, path.parent)
    return config


def _strip_comment(value: str) -> str:
    """Ansible's INI reader: an inline comment starts at ' ;' or ' #'."""
    return re.split(r"\s[;#]", value, maxsplit=1)[0].strip()


def _check(key: str, value: str, where: str, folder: Path) -> str:
    if key == "forks" and not (value.isdigit() and 1 <= int(value) <= 1024):
        raise InputError(f"{where}: forks = {value!r}: expected a whole number from 1 to 1024")
    if key == "become" and value.lower() not in _TRUE | _FALSE:
        raise InputError(f"{where}: become = {value!r}: expected true or false")
    if key in PATH_KEYS and value:
        parts = [p.strip() for p in value.split(",")] if key == "inventory" else [value]
        value = ",".join(str(folder / Path(p).expanduser()) for p in parts if p)
    return value
