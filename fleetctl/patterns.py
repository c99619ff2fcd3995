"""Ansible's two pattern languages: host ranges in inventory keys, host patterns on the command line.

Both follow ansible-core (plugins/inventory/__init__.py and inventory/manager.py), checked
against ansible-core 2.19 by tests/test_inventory_ansible.py. Where this code is stricter
than Ansible (bad ranges, a sub-pattern that matches nothing), it says why.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fleetctl.errors import PatternError

_DIGITS = re.compile(r"[0-9]+")
# Ansible's parse_address: "[v6addr]:port", or "host:port" where brackets are ranges.
_BRACKETED_HOSTPORT = re.compile(r"^\[(.+)\]:([0-9]+)$")
_HOSTPORT = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")
_HOSTNAME = re.compile(r"^(?:[\w-]|\[[^\]]*\])+(?:\.(?:[\w-]|\[[^\]]*\])+)*$")
# Ansible's PATTERN_WITH_SUBSCRIPT: "name[3]", "name[-1]", "name[1:3]", "name[2:]" (and "[1-3]").
_SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]$")
# Characters that make Ansible also try a pattern against host names when it matched a group.
_HOST_GLOB_CHARS = (".", "?", "*", "[")


_Matcher = Callable[[str], bool]


class RangeError(ValueError):
    """A host range such as ct[9:1] is malformed; the inventory loader adds file:line."""


def split_host_port(key: str) -> tuple[str, int | None]:
    """Split an inventory host key 'name:port' like Ansible; IPv6 needs '[addr]:port'."""
    for regex in (_BRACKETED_HOSTPORT, _HOSTPORT):
        m = regex.match(key)
        if m and _is_address(m.group(1)):
            return m.group(1), int(m.group(2))
    return key, None


def _is_address(text: str) -> bool:
    if _HOSTNAME.match(text):
        return True
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


MAX_RANGE_HOSTS = 100_000  # one range (or nested ranges) of a host entry; more is a typo, not a fleet


def expand_host_range(name: str) -> list[str]:
    """Expand 'ct[129:131]', 'gpu[01:08]', 'n[a:c]', 'x[1:10:2]' (several ranges allowed).

    Stricter than Ansible, which silently yields no hosts for ct[9:1] and crashes on ct[a:9].
    """
    if "[" not in name:
        return [name]
    head, _, rest = name.partition("[")
    body, closed, tail = rest.partition("]")
    if not closed:
        raise RangeError(f"host range in '{name}' has no closing ']'")
    names: list[str] = []
    for item in _range_items(body):
        names.extend(expand_host_range(head + item + tail))
        if len(names) > MAX_RANGE_HOSTS:
            raise RangeError(f"host range in '{name}' expands to more than {MAX_RANGE_HOSTS} hosts")
    return names


def _range_items(body: str) -> list[str]:
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise RangeError(f"host range '[{body}]' must be [begin:end] or [begin:end:step]")
    beg, end = bounds[0] or "0", bounds[1]
    step_text = bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise RangeError(f"host range '[{body}]' has no end")
    if not _DIGITS.fullmatch(step_text) or int(step_text) < 1:
        raise RangeError(f"host range '[{body}]' has a bad step '{step_text}' (expected a number >= 1)")
    step = int(step_text)
    letters = string.ascii_letters
    if len(beg) == 1 and len(end) == 1 and beg in letters and end in letters:
        if letters.index(beg) > letters.index(end):
            raise RangeError(f"host range '[{body}]' must have begin <= end")
        return list(letters[letters.index(beg) : letters.index(end) + 1 : step])
    if not (_DIGITS.fullmatch(beg) and _DIGITS.fullmatch(end)):
        raise RangeError(f"host range '[{body}]' must be two numbers or two single letters")
    width = len(beg) if beg.startswith("0") and len(beg) > 1 else 0
    if width and len(end) != width:
        raise RangeError(f"host range '[{body}]' is zero-padded, so begin and end need the same width")
    if int(beg) > int(end):
        raise RangeError(f"host range '[{body}]' must have begin <= end")
    if (int(end) - int(beg)) // step + 1 > MAX_RANGE_HOSTS:
        raise RangeError(f"host range '[{body}]' expands to {(int(end) - int(beg)) // step + 1} hosts "
                         f"(at most {MAX_RANGE_HOSTS})")
    return [str(i).zfill(width) for i in range(int(beg), int(end) + 1, step)]


@dataclass(frozen=True)
class HostIndex:
    """What pattern matching needs to know: names in inventory order, and each group's hosts.

    `group_hosts` maps every group (including 'all' and 'ungrouped') to its hosts and its
    descendants' hosts, in inventory order; that order is what subscripts like gpu[0] index.
    """

    hosts: Sequence[str]
    group_hosts: Mapping[str, Sequence[str]]

    def groups_line(self) -> str:
        names = sorted(g for g in self.group_hosts if g not in ("all", "ungrouped"))
        return ", ".join(names) if names else "(none)"


def split_pattern(pattern: str) -> list[str]:
    """Split like Ansible: on commas if there are any, else on ':' outside [brackets].

    A whole pattern that reads as an address ('host:22', an IPv6 address) stays whole.
    """
    if "," in pattern:
        parts = pattern.split(",")
    elif split_host_port(pattern)[1] is not None or _is_ipv6(pattern):
        parts = [pattern]
    else:
        parts = re.findall(r"(?:[^\s:\[\]]|\[[^\]]*\])+", pattern)
    return [p.strip() for p in parts if p.strip()]


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


def order_patterns(parts: Sequence[str]) -> list[str]:
    """Plain patterns (unions) first, then '&' intersections, then '!' exclusions.

    With only '&'/'!' parts, Ansible starts from 'all' ('!ct129' means all but ct129).
    """
    plain = [p for p in parts if p[0] not in "&!"]
    both = [p for p in parts if p[0] == "&"]
    minus = [p for p in parts if p[0] == "!"]
    return (plain or ["all"]) + both + minus


def select_names(pattern: str, index: HostIndex) -> list[str]:
    """Host names matching an Ansible host pattern, in Ansible's order (unsorted).

    Stricter than Ansible: a sub-pattern that matches no group and no host raises instead of
    warning, so a typo in 'gpu:!ct13O' cannot widen a rollout; an empty result raises too.
    """
    known = set(index.hosts)
    result: list[str] = []
    for part in order_patterns(split_pattern(pattern)):
        if part in known:  # a plain host name: Ansible's shortcut, before any group
            matched: list[str] = [part]
        else:
            matched = _match_one(part[1:] if part[0] in "&!" else part, pattern, index)
        if part[0] == "!":
            drop = set(matched)
            result = [h for h in result if h not in drop]
        elif part[0] == "&":
            keep = set(matched)
            result = [h for h in result if h in keep]
        else:
            seen = set(result)
            result.extend(h for h in dict.fromkeys(matched) if h not in seen)
    if not result:
        raise PatternError(f"no hosts match '{pattern}'; groups: {index.groups_line()}")
    return result


def _match_one(part: str, whole: str, index: HostIndex) -> list[str]:
    expr, subscript = _split_subscript(part)
    found_group, names = _enumerate(expr, index)
    if not names and not found_group:
        where = "" if expr == whole else f" (in '{whole}')"
        if subscript is not None:  # gpu0[1-3] is no glob in Ansible: say so
            where = f" (in '{whole}'; Ansible reads '{part[len(expr):]}' as a subscript)"
        raise PatternError(f"no hosts match '{expr}'{where}; groups: {index.groups_line()}")
    try:
        return _apply_subscript(names, subscript)
    except IndexError:
        raise PatternError(f"no hosts match the subscripted pattern '{part}'") from None


def _split_subscript(part: str) -> tuple[str, tuple[int, int | None] | None]:
    # As in Ansible, digits in brackets are a subscript, not a glob: gpu0[123] is gpu0, item 123.
    m = None if part.startswith("~") else _SUBSCRIPT.match(part)
    if not m:
        return part, None
    expr, idx, start, _sep, end = m.groups()
    if idx:
        return expr, (int(idx), None)
    return expr, (int(start), int(end) if end else -1)


def _apply_subscript(names: list[str], subscript: tuple[int, int | None] | None) -> list[str]:
    # Mirrors Ansible's _apply_subscript, including its quirk that [n:0] means [n].
    if not names or not subscript:
        return names
    start, end = subscript
    if end:
        return names[start : (len(names) - 1 if end == -1 else end) + 1]
    return [names[start]]


def _enumerate(expr: str, index: HostIndex) -> tuple[bool, list[str]]:
    """Hosts of every group matching expr, plus hosts matching it by name (Ansible's rules)."""
    match = _compile(expr)
    groups = [g for g in index.group_hosts if match(g)]
    names = [h for g in groups for h in index.group_hosts[g]]
    if not groups or expr[0] == "~" or any(c in expr for c in _HOST_GLOB_CHARS):
        names.extend(h for h in index.hosts if match(h))
    return bool(groups), names


def _compile(expr: str) -> _Matcher:
    # '~' is a regex anchored at the start only (Ansible uses re.match); else fnmatch, whole name.
    try:
        regex = re.compile(expr[1:] if expr[0] == "~" else fnmatch.translate(expr))
    except re.error as exc:
        raise PatternError(f"invalid host pattern '{expr}': {exc}") from None
    return lambda name: regex.match(name) is not None

