"""The user's OpenSSH client configuration, read as ``ssh`` reads it.

``~/.ssh/config`` first, then ``/etc/ssh/ssh_config`` (the first value found for a keyword
wins, as in OpenSSH), with ``Include`` expanded (paramiko's parser has no Include): relative
paths are relative to ``~/.ssh`` in the user's file and to ``/etc/ssh`` in the system's,
globs sorted, at most 16 levels deep. ``FLEETCTL_SSH_CONFIG`` names another user file
(``none``: read no ssh_config at all), as ``ssh -F`` does.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from fleetctl import ssh_options
from fleetctl.errors import InputError

SYSTEM_CONFIG = Path("/etc/ssh/ssh_config")
MAX_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
_INCLUDE = re.compile(r"^\s*include(?:\s*=\s*|\s+)(.+?)\s*$", re.I)
_BLOCK = re.compile(r"^\s*(host|match)(?:\s*=\s*|\s+)", re.I)
_SETTING = re.compile(r"(\w+)(?:\s*=\s*|\s+)(.+)")  # paramiko's; a line it cannot parse goes to it
# The keywords lookup() reads, or that change what it reads (Match, canonicalization): a config
# setting none of them gives every name the defaults, as Debian's stock /etc/ssh/ssh_config does.
_READ = frozenset({"hostname", "user", "port", "identityfile", "identitiesonly", "proxyjump", "proxycommand",
                   "match", "canonicalizehostname", "canonicaldomains", "canonicalizemaxdots",
                   "canonicalizefallbacklocal", "canonicalizepermittedcnames", *ssh_options.ALIVE_KEYWORDS})
# Any other keyword that applies to a host is reported once per run (ssh_options), unless it is quiet.


@dataclass(frozen=True)
class SSHConfigEntry:
    """What ssh_config says for one destination name (``None``: it says nothing)."""

    hostname: str
    user: str | None = None
    port: int | None = None
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    proxy_jump: str | None = None
    proxy_command: str | None = None
    alive_interval: float | None = None  # ServerAliveInterval
    alive_count_max: int | None = None  # ServerAliveCountMax
    ignored: tuple[tuple[str, str], ...] = ()  # (keyword and value as written, the file(s) setting it)
    source: str = ""  # the files read, for messages


def user_config_path() -> Path | None:
    configured = os.environ.get("FLEETCTL_SSH_CONFIG")
    if configured:
        return None if configured.lower() == "none" else Path(configured).expanduser()
    return Path("~/.ssh/config").expanduser()


def expand_includes(path: Path, base: Path, depth: int = 0) -> Iterator[tuple[Path, str]]:
    """The lines of ``path`` with every ``Include`` replaced by the lines it names, each with its file.

    An Include inside a Host or Match block applies within it, so the block's own header is
    repeated after the included lines: what follows the Include stays in the block it was in."""
    if depth > MAX_DEPTH:
        raise InputError(f"{path}: Include nested more than {MAX_DEPTH} deep")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ssh config: {exc.strerror or exc}") from None
    block: str | None = None
    for line in text.splitlines():
        found = _INCLUDE.match(line)
        if not found:
            if _BLOCK.match(line):
                block = line
            yield path, line
            continue
        for pattern in _split_words(found.group(1)):
            full = Path(os.path.expanduser(pattern))
            full = full if full.is_absolute() else base / full
            for match in sorted(glob.glob(str(full))):
                if Path(match).is_file():
                    yield from expand_includes(Path(match), base, depth + 1)
        if block is not None:
            yield path, block


def _split_words(value: str) -> list[str]:
    return [w.strip('"') for w in re.findall(r'"[^"]*"|\S+', value)]


@dataclass(frozen=True)
class LoadedConfig:
    parsed: Any  # paramiko.SSHConfig, or None: the files set nothing lookup() reads or reports
    sources: str  # the files read, for messages
    origins: dict[str, tuple[str, str]] = field(default_factory=dict)  # keyword -> (as spelt, the files)


def _sets_nothing_used(text: str) -> bool:
    """Only quiet keywords (Debian's stock file): every name gets the defaults, nothing to report."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        found = _SETTING.match(line)
        if found is None or found.group(1).lower() not in ssh_options.QUIET | {"host"}:
            return False
    return True


def parse(text: str, sources: str, origins: dict[str, tuple[str, str]] | None = None) -> LoadedConfig:
    """``text`` as paramiko reads it; ``origins`` (default: all of it from ``sources``) names the files."""
    origins = origins if origins is not None else _origins([(Path(sources), line) for line in text.splitlines()])
    if _sets_nothing_used(text):  # no paramiko import: a third of a short command's start
        return LoadedConfig(None, sources, origins)
    import paramiko

    try:
        return LoadedConfig(paramiko.SSHConfig.from_text(text), sources, origins)
    except Exception as exc:  # paramiko's ConfigParseError names the line's text
        raise InputError(f"{sources}: {exc}") from None


def _origins(lines: list[tuple[Path, str]]) -> dict[str, tuple[str, str]]:
    """Each keyword's spelling and the files that set it, for the line that reports it."""
    spelt: dict[str, str] = {}
    files: dict[str, list[str]] = {}
    for path, raw in lines:
        found = _SETTING.match(raw.strip())
        if found is None or raw.strip().startswith("#"):
            continue
        name = found.group(1).lower()
        spelt.setdefault(name, found.group(1))
        if str(path) not in files.setdefault(name, []):
            files[name].append(str(path))
    return {name: (spelt[name], " + ".join(paths)) for name, paths in files.items()}


@cache
def load(user_path: Path | None, system_path: Path = SYSTEM_CONFIG) -> LoadedConfig:
    """The user's file then the system's (a missing file reads as empty)."""
    lines: list[tuple[Path, str]] = []
    sources = []
    for path, base in ((user_path, Path("~/.ssh").expanduser()), (system_path, system_path.parent)):
        if path is not None and path.is_file():
            sources.append(str(path))
            lines += [*expand_includes(path, base), (path, "Host *")]  # each file's tail stays its own
    return parse("\n".join(line for _, line in lines), " + ".join(sources) or "no ssh config", _origins(lines))


def lookup(name: str, config: LoadedConfig | None = None) -> SSHConfigEntry:
    """ssh_config's settings for the destination ``name`` (a host alias or address)."""
    config = config if config is not None else load(user_config_path())
    if config.parsed is None:
        return SSHConfigEntry(hostname=name, source=config.sources)
    try:
        found = config.parsed.lookup(name)
    except Exception as exc:  # Match exec failing, a bad token: one line naming the files
        raise InputError(f"{config.sources}: host {name!r}: {exc}") from None
    port = found.get("port")
    if port is not None and not (str(port).isdigit() and 1 <= int(port) <= 65535):
        raise InputError(f"{config.sources}: host {name!r}: Port {port!r} is not 1-65535")
    jump = found.get("proxyjump")
    alive, count = (_alive(found, key, parse, name, config) for key, parse in (
        ("serveraliveinterval", ssh_options.parse_seconds), ("serveralivecountmax", ssh_options.parse_count)))
    return SSHConfigEntry(
        hostname=found.get("hostname") or name,
        user=found.get("user"),
        port=int(port) if port is not None else None,
        identity_files=tuple(os.path.expanduser(p) for p in found.get("identityfile") or ()),
        identities_only=str(found.get("identitiesonly", "no")).lower() == "yes",
        proxy_jump=None if jump is None or jump.lower() == "none" else jump,
        proxy_command=found.get("proxycommand") or None,
        alive_interval=alive,
        alive_count_max=count,
        ignored=_not_read(found, config),
        source=config.sources,
    )


def _alive(found: Any, key: str, parse: Any, name: str, config: LoadedConfig) -> Any:
    if found.get(key) is None:
        return None
    try:
        return parse(found[key])
    except ValueError as exc:
        spelt = config.origins.get(key, (key, config.sources))
        raise InputError(f"{spelt[1]}: host {name!r}: {spelt[0]} {exc}") from None


def _not_read(found: Any, config: LoadedConfig) -> tuple[tuple[str, str], ...]:
    """The keywords that apply to this name and that fleetctl does not read, as written."""
    out = []
    for key in sorted(k for k in found if k not in _READ and k not in ssh_options.QUIET):
        value = found[key]
        text = " ".join(value) if isinstance(value, list) else str(value)
        spelt, files = config.origins.get(key, (key, config.sources))
        out.append((f"{spelt} {text}", files))
    return tuple(out)
