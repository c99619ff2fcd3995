"""Secrets the CLI asks for once per run: the become password (``-K``) and vault passwords, hidden on a terminal,
one line each when piped in."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from fleetctl.transport.target import ConnectOptions
    from fleetctl.vault import Vault, VaultSecret


def connect_options(user: str | None, private_key: str | None, become: bool, become_user: str | None,
                    ask_become_pass: bool) -> ConnectOptions:
    """The CLI's connection defaults; ``-K`` asks for the password once, on the terminal (hidden)."""
    from fleetctl.transport.target import ConnectOptions

    password = None
    if ask_become_pass and sys.stdin.isatty():
        password = click.prompt("BECOME password", hide_input=True, err=True, default="", show_default=False)
    elif ask_become_pass:  # piped in (a script, a test): one line, no echo warnings
        password = sys.stdin.readline().rstrip("\r\n")
    if password:
        from fleetctl import redact

        redact.register([password])  # masked in every output (redact.py)
    key = str(Path(private_key).expanduser().absolute()) if private_key else None
    return ConnectOptions(user=user, private_key=key, become=become or become_user is not None,
                          become_user=become_user, become_password=password)


def vault_options(password_files: tuple[str, ...], vault_ids: tuple[str, ...], ask_vault_pass: bool) -> Vault:
    """The run's vault passwords: ``--vault-id label@file`` (or ``label@prompt``), ``--vault-password-file``
    (label 'default'), ``--ask-vault-pass`` (asked once, hidden; one line when piped)."""
    from fleetctl.vault import Vault, parse_vault_id, read_password_file

    secrets: list[VaultSecret] = []
    for value in vault_ids:
        label, source = parse_vault_id(value)
        secrets.append(_ask_vault(label) if source == "prompt" else read_password_file(source, label))
    secrets.extend(read_password_file(path) for path in password_files)
    if ask_vault_pass:
        secrets.append(_ask_vault("default"))
    return Vault(secrets) if secrets else Vault()


def _ask_vault(label: str) -> VaultSecret:
    from fleetctl.vault import VaultSecret

    what = "Vault password" + (f" ({label})" if label != "default" else "")
    if sys.stdin.isatty():
        password = click.prompt(what, hide_input=True, err=True)
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    return VaultSecret(label, password.encode())
