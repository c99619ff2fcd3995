"""Secrets never reach output: variables named in a host's ``secret_vars`` list, the password and
passphrase connection variables, and every value decrypted from an Ansible vault (a
``vault.VaultStr``, wherever it sits in a variable) are masked."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleetctl import redact
from fleetctl.vault import VaultStr

MASK = redact.MASK
# Secrets by their nature: masked wherever vars are shown, without being listed in secret_vars.
SECRET_ANSIBLE_VARS = frozenset({
    "ansible_password", "ansible_ssh_pass", "ansible_ssh_password", "ansible_ssh_private_key_passphrase",
    "ansible_become_password", "ansible_become_pass",
})


def vault_values(value: Any) -> list[str]:
    """Every vault-decrypted string inside a value (nested lists and mappings included)."""
    if isinstance(value, VaultStr):
        return [str(value)]
    if isinstance(value, list | tuple):
        return [v for item in value for v in vault_values(item)]
    if isinstance(value, Mapping):
        return [v for item in value.values() for v in vault_values(item)]
    return []


def secret_names(host_vars: Mapping[str, Any]) -> set[str]:
    """Listed in ``secret_vars``, secret by nature, vault-decrypted, or a template rendered from a
    vault value (``hf_token: "{{ vault_hf_token }}"``)."""
    names = host_vars.get("secret_vars") or []
    listed = {str(n) for n in names} if isinstance(names, list | tuple) else {str(names)}
    vaulted = {k for k, v in host_vars.items() if vault_values(v) or vault_values(_rendered(host_vars, k))}
    return listed | (SECRET_ANSIBLE_VARS & host_vars.keys()) | vaulted


def _rendered(host_vars: Mapping[str, Any], name: str) -> Any:
    """The variable as templates see it (its templates rendered); as written when it does not render."""
    from fleetctl import templating

    value = host_vars.get(name)
    if not templating.has_template(value):
        return value
    try:
        return templating.LazyVars(host_vars)[name]
    except templating.TemplateProblem:
        return value


def masked(host_vars: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the vars with every secret's value replaced by the mask."""
    names = secret_names(host_vars)
    return {k: (MASK if k in names and v is not None else v) for k, v in host_vars.items()}


def secret_values(host_vars: Mapping[str, Any]) -> list[str]:
    """The values of the host's secret variables, longest first (a secret holding another is masked whole)."""
    values = {str(_rendered(host_vars, n)) for n in secret_names(host_vars) if host_vars.get(n) not in (None, "")}
    values.update(v for value in host_vars.values() for v in vault_values(value) if v)
    return sorted(values, key=lambda v: (-len(v), v))


def register_declared(all_host_vars: Iterable[Mapping[str, Any]]) -> None:
    """Register with ``redact.py`` the values of every host's ``secret_vars`` and of the password and
    passphrase variables (``-e`` ones included: they are host variables). Cheap: only those names are
    read, their templates rendered; vault values were registered when decrypted."""
    for host_vars in all_host_vars:
        listed = host_vars.get("secret_vars") or []
        names = {str(n) for n in listed} if isinstance(listed, list | tuple) else {str(listed)}
        names |= SECRET_ANSIBLE_VARS & host_vars.keys()
        redact.register(str(_rendered(host_vars, n)) for n in names if host_vars.get(n) not in (None, ""))


def mask_values(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of each value (longest first) replaced by the mask."""
    for value in values:
        text = text.replace(value, MASK)
    return text


class Redactor:
    """Masks every secret value wherever it appears in strings, recursively (outputs, messages,
    diffs, variables): what a run journal or a playbook's output may hold."""

    def __init__(self, values: Iterable[str]) -> None:
        self.values = sorted({v for v in values if v}, key=lambda v: (-len(v), v))
        redact.register(self.values)

    def learn(self, values: Iterable[str]) -> None:
        """Mask these too from now on (a vault file a template read mid-run), here and in every output."""
        self.values = sorted({*self.values, *(v for v in values if v)}, key=lambda v: (-len(v), v))
        redact.register(self.values)

    @classmethod
    def for_hosts(cls, host_vars: Iterable[Mapping[str, Any]]) -> Redactor:
        return cls(v for hv in host_vars for v in secret_values(hv))

    def __call__(self, value: Any) -> Any:
        """Its own values masked (short ones too), then every value the process registered."""
        return redact.redact_obj(self._own(value))

    def _own(self, value: Any) -> Any:
        if not self.values:
            return value
        if isinstance(value, str):
            return mask_values(value, self.values)
        if isinstance(value, list | tuple):
            return [self._own(v) for v in value]
        if isinstance(value, dict):
            return {k: self._own(v) for k, v in value.items()}
        return value
