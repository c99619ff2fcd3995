"""Fully qualified module names (``ansible.builtin.copy``), which ansible-lint's ``fqcn`` rule makes
universal: the ``ansible.builtin.`` and ``ansible.legacy.`` names of the Ansible modules and keywords
fleetctl implements read exactly as their short names. fleetctl's own modules (``release``, ``probe``,
``service``, ...) have no Ansible name: ``ansible.builtin.service`` is Ansible's service manager, not
fleetctl's SGLang service, so it is refused like any module fleetctl does not have.
"""

from __future__ import annotations

from typing import Any

from fleetctl import yamlfile

PREFIXES = ("ansible.builtin.", "ansible.legacy.")
# Ansible's modules and task keywords that fleetctl has, by their short name.
ANSIBLE_NAMES = frozenset({
    "assert", "async_status", "command", "copy", "debug", "fail", "fetch", "file", "get_url", "lineinfile",
    "pause", "reboot", "set_fact", "shell", "stat", "systemd", "template", "uri", "wait_for",
    "include_tasks", "import_tasks", "meta", "import_playbook",
})
ALIASES = {"systemd_service": "systemd"}  # ansible-core 2.14+: systemd is a redirect to systemd_service


def short_name(key: Any) -> str | None:
    """The short name an FQCN stands for; None when ``key`` is no FQCN (or one fleetctl lacks)."""
    if not isinstance(key, str):
        return None
    prefix = next((p for p in PREFIXES if key.startswith(p)), None)
    if prefix is None:
        return None
    name = key[len(prefix):]
    name = ALIASES.get(name, name)
    return name if name in ANSIBLE_NAMES else None


def normalize(doc: yamlfile.YamlDoc, at: tuple[Any, ...], raw: Any) -> Any:
    """``raw`` (a task or play mapping) with its FQCN keys renamed to short names, in place (the key's
    line stays known); an ``ansible.*`` name fleetctl does not have is one error naming file:line."""
    if not isinstance(raw, dict) or not any(isinstance(k, str) and k.startswith("ansible.") for k in raw):
        return raw
    renamed: list[tuple[Any, Any]] = []
    lines = doc.key_lines.get(id(raw), {})
    for key, value in raw.items():
        short = short_name(key)
        if short is None and isinstance(key, str) and key.startswith(PREFIXES):
            raise doc.error(at + (key,), f"{key}: fleetctl has no such module (its Ansible modules: "
                                         f"{', '.join(sorted(ANSIBLE_NAMES - {'meta', 'import_playbook'}))})")
        if short is not None and key in lines:
            lines[short] = lines[key]
        renamed.append((short or key, value))
    raw.clear()
    raw.update(renamed)
    return raw
