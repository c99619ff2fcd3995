"""`-e` variables that nothing reads: a misspelled ``-e relase_spec=...`` must not
silently fall back to the playbook's default.

"Read" is decided statically, before anything runs, and generously (a warning must never be wrong
about a variable that is used): a name counts as read when it is a variable of any Jinja template
the run can reach, or a host variable fleetctl itself reads. The templates are every string in the
YAML files under the playbook's folder (its tasks, vars, included files, roles, release specs; a
``when:``/``that:``/``until:`` string as the bare expression it is), every ``.j2`` file there, and
the inventory's files with the group_vars/host_vars beside them. Jinja's own parser names the
variables (``meta.find_undeclared_variables``), so a word in a comment or a plain value is not one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment, TemplateSyntaxError, meta

# Host variables fleetctl's own code reads (besides every ansible_* and fleetctl_* one).
FLEETCTL_HOST_VARS = frozenset({"venv", "service_host", "service_port", "nvidia_smi", "gpus_expected",
                                "gpus_per_host", "direct_ssh_key", "secret_vars", "gpu_name", "triton_version"})
CONDITIONS = frozenset({"when", "that", "until", "failed_when", "changed_when"})  # bare Jinja expressions
MAX_FILES, MAX_BYTES = 5000, 1 << 20


class _AnyTagLoader(yaml.SafeLoader):
    """Reads !vault and other tagged values as plain ones: only their text matters here."""


def _untagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node) if isinstance(node, yaml.MappingNode) else None


_AnyTagLoader.add_multi_constructor("!", _untagged)


def unread_warning(given: Iterable[str], playbook: Path, inventory_files: Iterable[Path]) -> str | None:
    """One line naming the ``given`` names nothing reads, each with the closest name that is read (a
    misspelling's fix); None when every one is read."""
    wanted = sorted(n for n in given if not n.startswith(("ansible_", "fleetctl_")) and n not in FLEETCTL_HOST_VARS)
    if not wanted:
        return None
    read = template_variables(_files(playbook, inventory_files))
    names = [n for n in wanted if n not in read]
    if not names:
        return None
    known = sorted(read | FLEETCTL_HOST_VARS)
    parts = []
    for name in names:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        parts.append(f"{name} (did you mean {close[0]}?)" if close else name)
    one = len(names) == 1
    return (f"-e {', '.join(parts)}: no template of {playbook}, the files beside it or the inventory reads "
            f"{'it' if one else 'them'}, nor does fleetctl; {'it changes' if one else 'they change'} nothing")


def _files(playbook: Path, inventory_files: Iterable[Path]) -> list[Path]:
    found = [playbook]
    found += _walk(playbook.resolve().parent)
    for source in inventory_files:
        found += [source, *_walk(source)]  # a file, or an inventory folder
        for beside in ("group_vars", "host_vars"):
            found += _walk(source.resolve().parent / beside)
    return found[:MAX_FILES]


def _walk(folder: Path) -> Iterator[Path]:
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*")):
        if path.suffix in (".yml", ".yaml", ".j2") and path.is_file() and ".fleetctl" not in path.parts:
            yield path


def template_variables(files: Iterable[Path]) -> set[str]:
    env, names = Environment(), set()
    for path in dict.fromkeys(files):
        try:
            if path.stat().st_size > MAX_BYTES:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if path.suffix == ".j2":
            names |= _variables(env, text)
            continue
        try:
            docs = list(yaml.load_all(text, Loader=_AnyTagLoader))  # noqa: S506 (a SafeLoader subclass)
        except yaml.YAMLError:
            names |= _variables(env, text)  # not YAML: its text as one template
            continue
        for template in _strings(docs):
            names |= _variables(env, template)
    return names


def _strings(node: Any, condition: bool = False) -> Iterator[str]:
    if isinstance(node, str):
        yield "{{ " + node + " }}" if condition and "{{" not in node else node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(key)
            yield from _strings(value, condition=str(key) in CONDITIONS)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item, condition)


def _variables(env: Environment, template: str) -> set[str]:
    if "{" not in template:
        return set()
    try:
        return set(meta.find_undeclared_variables(env.parse(template)))
    except TemplateSyntaxError:
        return set()
