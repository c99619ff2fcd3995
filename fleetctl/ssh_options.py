"""OpenSSH options as users write them (``ansible_ssh_common_args``, ssh_config keywords): the few
fleetctl honours, and one warning per run for each one it does not (never dropped silently).

Honoured: a bastion (``-J``, ProxyJump, ProxyCommand) and keepalives (ServerAliveInterval,
ServerAliveCountMax; ``DEFAULT_ALIVE_INTERVAL`` when none is set, where OpenSSH sends none: builds,
gates and copies keep a channel quiet for up to an hour, longer than many NAT and bastion idle
timeouts). ssh_config's connection keywords are read in ``transport/ssh_config.py``. Host-key options
(StrictHostKeyChecking other than yes, UserKnownHostsFile, GlobalKnownHostsFile) are never honoured:
fleetctl always checks host keys against its own known_hosts, and says so in a line of its own.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

log = logging.getLogger("fleetctl.ssh")
T = TypeVar("T")

DEFAULT_ALIVE_INTERVAL = 15.0  # seconds; OpenSSH's default is 0 (none)
DEFAULT_ALIVE_COUNT_MAX = 3  # OpenSSH's default
ALIVE_KEYWORDS = frozenset({"serveraliveinterval", "serveralivecountmax"})
HOST_KEY_KEYWORDS = frozenset({"stricthostkeychecking", "userknownhostsfile", "globalknownhostsfile"})
# Nothing to report: they matter to an interactive ssh or to ssh's own files, which fleetctl's
# unattended connections, its own known_hosts and its kept connections replace. (Debian's stock
# /etc/ssh/ssh_config sets the first three for every host: a warning on every run would be noise.)
QUIET = frozenset({"sendenv", "hashknownhosts", "gssapiauthentication", "gssapidelegatecredentials",
                   "controlmaster", "controlpath", "controlpersist", "visualhostkey", "loglevel", "requesttty",
                   "forwardx11", "forwardx11trusted", "escapechar", "addkeystoagent", "usekeychain"})
# ssh flags that take a value (ssh(1)); any other flag stands alone.
_FLAGS_WITH_VALUE = frozenset("BbcDEeFIiJLlmOopQRSWw")
_HINTS = {"-i": "set ansible_ssh_private_key_file", "-p": "set ansible_port", "-l": "set ansible_user",
          "connecttimeout": "set ansible_timeout", "identityfile": "set ansible_ssh_private_key_file",
          "port": "set ansible_port", "user": "set ansible_user", "hostname": "set ansible_host"}
_TIME = re.compile(r"(\d+)([smhdw]?)", re.I)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_seconds(value: str) -> float:
    """An OpenSSH time value (``30``, ``1m30s``) in seconds; ValueError when it is not one."""
    text = str(value).strip()
    parts = _TIME.findall(text)
    if not text or "".join(n + u for n, u in parts).lower() != text.lower():
        raise ValueError(f"{value!r} is not a time (seconds, or like 1m30s)")
    return float(sum(int(n) * _UNITS[u.lower()] for n, u in parts))


def parse_count(value: str) -> int:
    text = str(value).strip()
    if not text.isdigit():
        raise ValueError(f"{value!r} is not a whole number")
    return int(text)


@dataclass(frozen=True)
class SSHArgs:
    """What one ``ansible_ssh_*_args`` string says that fleetctl uses, and what it leaves out."""

    jump: str | None = None
    proxy_command: str | None = None
    alive_interval: float | None = None
    alive_count_max: int | None = None
    ignored: tuple[str, ...] = ()  # each as written: ``-o ForwardAgent=yes``, ``-C``


def parse_ssh_args(args: str, var: str) -> SSHArgs:
    """The options of ``args``, split like a shell line; the first value of each option wins, as in
    OpenSSH. ValueError names ``var`` and the option."""
    try:
        tokens = shlex.split(args)
    except ValueError as exc:
        raise ValueError(f"{var} cannot be split like a shell line: {exc}") from None
    found: dict[str, tuple[str, str]] = {}  # jump / keyword -> (how, value)
    ignored: list[str] = []
    i = 0
    while i < len(tokens):
        token, i = tokens[i], i + 1
        flag, value = token[:2], token[2:]
        takes_value = len(token) >= 2 and token[0] == "-" and token[1] in _FLAGS_WITH_VALUE
        if takes_value and not value:
            if i >= len(tokens):
                raise ValueError(f"{var}: '{token}' needs a value")
            value, i = tokens[i], i + 1
        if flag == "-o" and "=" not in value and " " not in value.strip() and i < len(tokens):
            value, i = f"{value}={tokens[i]}", i + 1  # -o Key value (as earlier fleetctl read it)
        if flag == "-J":
            found.setdefault("jump", ("jump", value))
        elif flag == "-o":
            _option(value, var, found, ignored)
        else:
            ignored.append(f"{flag} {value}" if takes_value else token)
    how, target = found.get("jump", ("", "none"))
    target = "" if target.lower() == "none" else target
    alive, count = found.get("serveraliveinterval"), found.get("serveralivecountmax")
    return SSHArgs(jump=target if how == "jump" and target else None,
                   proxy_command=target if how == "command" and target else None,
                   alive_interval=_checked(parse_seconds, alive, var),
                   alive_count_max=_checked(parse_count, count, var), ignored=tuple(ignored))


def _option(option: str, var: str, found: dict[str, tuple[str, str]], ignored: list[str]) -> None:
    key, sep, value = option.partition("=")
    if not sep:
        key, _, value = option.strip().partition(" ")
    key, value = key.strip(), value.strip()
    name = key.lower()
    if name in ("proxyjump", "proxycommand"):
        if not value:
            raise ValueError(f"{var}: '-o {key}' needs a value")
        found.setdefault("jump", ("jump" if name == "proxyjump" else "command", value))
    elif name in ALIVE_KEYWORDS:
        found.setdefault(name, (key, value))
    else:
        ignored.append(f"-o {key}={value}")


def _checked(parse: Callable[[str], T], given: tuple[str, str] | None, var: str) -> T | None:
    if given is None:
        return None
    try:
        return parse(given[1])
    except ValueError as exc:
        raise ValueError(f"{var}: {given[0]} {exc}") from None


def split_option(text: str) -> tuple[str, str]:
    """(keyword or flag, value) of ``-o Key=value``, ``Key value`` or a bare flag."""
    if text.startswith("-o "):
        key, _, value = text[3:].partition("=")
        return key, value
    key, _, value = text.partition(" ")
    return key, value


def is_harmless(keyword: str, value: str) -> bool:
    """Options with nothing to report: what fleetctl does anyway, or only an interactive ssh's."""
    name = keyword.lower()
    return name in QUIET or (name == "stricthostkeychecking" and value.strip().lower() == "yes")


def ignored_line(text: str, where: str, host: str, known_hosts: Path | str) -> str:
    """The one line that says fleetctl does not honour ``text`` (an option as written)."""
    keyword, _ = split_option(text)
    if keyword.lower() in HOST_KEY_KEYWORDS:
        return (f"fleetctl ignores '{text}' ({where}, host {host}) and still checks host keys, against "
                f"{known_hosts} (pin new hosts with `fleetctl hosts trust`)")
    hint = _HINTS.get(keyword.lower())
    return (f"ssh option '{text}' ({where}, host {host}) is not honoured by fleetctl; ignored"
            + (f" ({hint})" if hint else ""))


_reported: set[tuple[str, str]] = set()  # (option, where): each said once per run (one process)


def unreported(options: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (option as written, where) pairs not yet reported in this run and worth a line."""
    return [(text, where) for text, where in options
            if (text, where) not in _reported and not is_harmless(*split_option(text))]


def report_ignored(options: Iterable[tuple[str, str]], host: str, known_hosts: Path | str) -> None:
    """Warn once per run about each option fleetctl does not honour (naming the first host it was seen for)."""
    for text, where in unreported(options):
        _reported.add((text, where))
        log.warning("%s", ignored_line(text, where, host, known_hosts))


def forget_reports() -> None:
    """A new run in the same process (tests) reports again."""
    _reported.clear()
