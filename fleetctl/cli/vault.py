"""``fleetctl vault``: encrypt, decrypt and view files, and encrypt one string, in Ansible's format."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fleetctl.cli.context import AppContext
from fleetctl.errors import InputError
from fleetctl.vault import Vault, is_encrypted


def _vault(app: AppContext) -> Vault:
    if not app.vault:
        raise InputError("vault: give a password (--vault-password-file, --vault-id or --ask-vault-pass)")
    return app.vault


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None


@click.group()
def vault() -> None:
    """Ansible Vault files and strings (the global --vault-password-file / --vault-id give the password)."""


@vault.command()
@click.option("--encrypt-vault-id", "label", metavar="LABEL", help="Which --vault-id label to encrypt with.")
@click.argument("files", nargs=-1, required=True)
@click.pass_obj
def encrypt(app: AppContext, files: tuple[str, ...], label: str | None) -> None:
    """Encrypt FILES in place."""
    v = _vault(app)
    for path in files:
        data = _read(path)
        if is_encrypted(data):
            raise InputError(f"{path}: already vault-encrypted")
        Path(path).write_text(v.encrypt(data, label))
        click.echo(f"Encryption successful: {path}", err=True)


@vault.command()
@click.argument("files", nargs=-1, required=True)
@click.pass_obj
def decrypt(app: AppContext, files: tuple[str, ...]) -> None:
    """Decrypt FILES in place."""
    v = _vault(app)
    for path in files:
        Path(path).write_bytes(v.decrypt(_read(path).decode("ascii", "replace"), path))
        click.echo(f"Decryption successful: {path}", err=True)


@vault.command()
@click.argument("file")
@click.pass_obj
def view(app: AppContext, file: str) -> None:
    """Print FILE decrypted."""
    sys.stdout.buffer.write(_vault(app).decrypt(_read(file).decode("ascii", "replace"), file))


@vault.command("encrypt-string")
@click.option("-n", "--name", help="Print NAME: !vault | ..., ready for a vars file.")
@click.option("--encrypt-vault-id", "label", metavar="LABEL", help="Which --vault-id label to encrypt with.")
@click.argument("value", required=False)
@click.pass_obj
def encrypt_string(app: AppContext, value: str | None, name: str | None, label: str | None) -> None:
    """Encrypt VALUE (else stdin) as a !vault value."""
    text = value if value is not None else sys.stdin.read()
    body = _vault(app).encrypt(text.encode(), label)
    indented = "\n".join("          " + line for line in body.splitlines())
    click.echo(f"{name + ': ' if name else ''}!vault |\n{indented}")
