"""Lock files: ``pip freeze`` output or a requirements file whose every line pins ``name==version``.

Shared by ``drift --lock`` (the baseline) and ``venv create --lock`` (what to install).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.errors import InputError

if TYPE_CHECKING:  # imported where a lock is read: `drift` without --lock never loads packaging's parser
    from packaging.requirements import Requirement

# pip freeze leaves these out of its output; a lock made by it never pins them.
FREEZE_EXCLUDED = frozenset({"pip", "setuptools", "wheel", "distribute"})


@dataclass(frozen=True)
class Pin:
    name: str  # canonical (PEP 503) name
    version: str
    line: int
    text: str
    hashes: tuple[str, ...] = ()  # "sha256:HEX" from pip's hash-checking form (--hash=sha256:HEX)


HASH_OPTION = re.compile(r"\s--hash[=\s](\w+:[0-9a-fA-F]+)")


def split_hashes(text: str) -> tuple[str, tuple[str, ...]]:
    """``name==1.0 --hash=sha256:ab --hash=sha256:cd`` -> (``name==1.0``, (``sha256:ab``, ``sha256:cd``))."""
    found = tuple(h.lower() for h in HASH_OPTION.findall(" " + text))
    return (HASH_OPTION.sub("", " " + text).strip(), found) if found else (text, ())


def requirement_lines(path: Path, what: str) -> list[tuple[int, str, Requirement]]:
    """(line number, text, Requirement) of every requirement line; comments and blank lines
    skipped; a line's ``--hash=`` options (pip's hash-checking form) are kept in the text but not
    parsed as the requirement; other options (-e, -r, --index-url) refused: one error naming
    file:line."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    out = []
    for number, raw in enumerate(lines, 1):
        text = raw.split(" #", 1)[0].strip()
        if not text or text.startswith("#"):
            continue
        if text.startswith("-"):
            raise InputError(f"{path}:{number}: options like {text.split()[0]!r} are not supported in a {what}")
        try:
            out.append((number, text, Requirement(split_hashes(text)[0])))
        except InvalidRequirement as exc:
            raise InputError(f"{path}:{number}: not a requirement: {text!r} ({exc})") from None
    return out


def parse_lock(path: Path) -> dict[str, Pin]:
    """Pins by canonical name; anything that is not an exact pin is an error naming file:line."""
    pins: dict[str, Pin] = {}
    for number, text, req in requirement_lines(path, "lock file"):
        pin = _pin(path, number, text, req)
        if pin.name in pins:
            raise InputError(f"{path}:{number}: {pin.name} is pinned twice (first on line {pins[pin.name].line})")
        pins[pin.name] = pin
    return pins


def _pin(path: Path, number: int, text: str, req: Requirement) -> Pin:
    from packaging.utils import canonicalize_name

    specs = list(req.specifier)
    if req.url or len(specs) != 1 or specs[0].operator not in ("==", "===") or "*" in specs[0].version:
        raise InputError(f"{path}:{number}: {text!r} is not an exact pin (expected name==version)")
    return Pin(canonicalize_name(req.name), specs[0].version, number, text, split_hashes(text)[1])
