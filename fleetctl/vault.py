"""Ansible Vault, in Ansible's own format: ``$ANSIBLE_VAULT;1.1;AES256`` (and ``1.2`` with a vault-id
label), AES-256-CTR with PKCS7 padding and an HMAC-SHA256 over the ciphertext, keys from
PBKDF2-HMAC-SHA256 (10,000 rounds, a 32-byte salt). Checked against files made by the real
``ansible-vault`` (tests/test_vault.py).

A decrypted value is a ``VaultStr``: a ``str`` that secrets.py treats as a secret wherever it goes
(masked in output, --json and run journals) without being listed in ``secret_vars``; it is
registered with ``redact.py`` when made, and so is each vault password. Which passwords exist is
decided once at the CLI (``--vault-password-file``, ``--vault-id``, ``--ask-vault-pass``) and
passed down as a ``Vault``.
"""

from __future__ import annotations

import binascii
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl import redact
from fleetctl.errors import InputError

HEADER = "$ANSIBLE_VAULT"
_ROUNDS = 10_000


class VaultError(InputError):
    """A vault cannot be opened: no password, a wrong one, or a damaged envelope."""


class VaultStr(str):
    """A value decrypted from a vault: a secret wherever it goes (masked in every output from the
    moment it exists: ``redact.py``)."""

    __slots__ = ()

    def __new__(cls, value: object = "") -> VaultStr:
        made = super().__new__(cls, value)
        redact.register([str.__str__(made)])
        return made


@dataclass(frozen=True)
class VaultSecret:
    label: str
    password: bytes = field(repr=False)

    def __post_init__(self) -> None:
        redact.register([self.password.decode("utf-8", "replace").strip()])


def is_encrypted(data: str | bytes) -> bool:
    head = data[:len(HEADER)]
    return (head.decode("ascii", "replace") if isinstance(head, bytes) else head) == HEADER


def _derive(password: bytes, salt: bytes) -> tuple[bytes, bytes, bytes]:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

    key = PBKDF2HMAC(algorithm=hashes.SHA256(), length=80, salt=salt, iterations=_ROUNDS).derive(password)
    return key[:32], key[32:64], key[64:]


def _envelope(text: str) -> tuple[str | None, bytes, bytes, bytes]:
    """(label, salt, hmac, ciphertext) of a vault text; ValueError when it is damaged."""
    lines = [line.strip() for line in text.strip().splitlines()]
    header = lines[0].split(";")
    if len(header) < 3 or header[0] != HEADER or header[1] not in ("1.1", "1.2"):
        raise ValueError(f"unknown vault header '{lines[0]}' (expected $ANSIBLE_VAULT;1.1;AES256 or 1.2)")
    if header[2].strip() != "AES256":
        raise ValueError(f"vault cipher '{header[2]}' is not supported (expected AES256)")
    label = header[3].strip() if header[1] == "1.2" and len(header) > 3 else None
    try:
        inner = binascii.unhexlify("".join(lines[1:]))
        salt, mac, ciphertext = inner.split(b"\n", 2)
        return label, binascii.unhexlify(salt), binascii.unhexlify(mac), binascii.unhexlify(ciphertext)
    except (binascii.Error, ValueError):
        raise ValueError("the vault text is damaged (its hex body does not decode)") from None


def _decrypt_one(password: bytes, salt: bytes, mac: bytes, ciphertext: bytes) -> bytes | None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, hmac, padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key, mac_key, iv = _derive(password, salt)
    check = hmac.HMAC(mac_key, hashes.SHA256())
    check.update(ciphertext)
    try:
        check.verify(mac)
    except InvalidSignature:
        return None
    decryptor = Cipher(algorithms.AES(key), modes.CTR(iv)).decryptor()
    padded = decryptor.update(ciphertext) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    return unpadder.update(padded) + unpadder.finalize()


class Vault:
    """The vault passwords this run was given, each with its vault-id label."""

    def __init__(self, secrets: Sequence[VaultSecret] = ()) -> None:
        self.secrets = list(secrets)

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def decrypt(self, text: str, where: str) -> bytes:
        """The plaintext of one vault text; ``where`` ('file:line') starts every error line."""
        try:
            label, salt, mac, ciphertext = _envelope(text)
        except (ValueError, IndexError) as exc:
            raise VaultError(f"{where}: {exc}") from None
        if not self.secrets:
            raise VaultError(f"{where}: vault-encrypted, but no vault password was given "
                             "(--vault-password-file, --vault-id or --ask-vault-pass)")
        # The secret whose label the envelope names first, then every other one (Ansible's default).
        ordered = sorted(self.secrets, key=lambda s: s.label != label)
        for secret in ordered:
            plain = _decrypt_one(secret.password, salt, mac, ciphertext)
            if plain is not None:
                return plain
        tried = ", ".join(dict.fromkeys(s.label for s in self.secrets))
        raise VaultError(f"{where}: wrong vault password: none of the given ones decrypts this (tried: {tried})")

    def decrypt_str(self, text: str, where: str) -> VaultStr:
        plain = self.decrypt(text, where)
        try:
            return VaultStr(plain.decode("utf-8"))
        except UnicodeDecodeError:
            raise VaultError(f"{where}: the decrypted vault value is not UTF-8 text") from None

    def encrypt(self, plaintext: bytes, label: str | None = None, salt: bytes | None = None) -> str:
        """A vault text for ``plaintext`` with the secret of ``label`` (else the first one): 1.2 with a
        label other than 'default', else 1.1, as ansible-vault writes it."""
        if not self.secrets:
            raise VaultError("encrypting needs a vault password (--vault-password-file, --vault-id or "
                             "--ask-vault-pass)")
        secret = next((s for s in self.secrets if s.label == label), self.secrets[0])
        return encrypt(plaintext, secret.password, secret.label, salt)


def encrypt(plaintext: bytes, password: bytes, label: str = "default", salt: bytes | None = None) -> str:
    from cryptography.hazmat.primitives import hashes, hmac, padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    salt = salt or os.urandom(32)
    key, mac_key, iv = _derive(password, salt)
    padder = padding.PKCS7(128).padder()
    padded = padder.update(plaintext) + padder.finalize()
    encryptor = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
    ciphertext = encryptor.update(padded) + encryptor.finalize()
    mac = hmac.HMAC(mac_key, hashes.SHA256())
    mac.update(ciphertext)
    body = binascii.hexlify(b"\n".join([binascii.hexlify(salt), binascii.hexlify(mac.finalize()),
                                        binascii.hexlify(ciphertext)])).decode("ascii")
    header = f"{HEADER};1.2;AES256;{label}" if label and label != "default" else f"{HEADER};1.1;AES256"
    return "\n".join([header, *(body[i:i + 80] for i in range(0, len(body), 80))]) + "\n"


def read_password_file(path: str, label: str = "default") -> VaultSecret:
    """A password file's first line, or what an executable one prints (Ansible's vault password
    scripts); a '*-client' script is asked with ``--vault-id LABEL``, as Ansible does."""
    file = Path(path).expanduser()
    try:
        if os.access(file, os.X_OK) and file.is_file():
            args = [str(file), "--vault-id", label] if file.stem.endswith("-client") else [str(file)]
            done = subprocess.run(args, capture_output=True, timeout=120, check=False)
            if done.returncode != 0:
                tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no stderr"]
                raise VaultError(f"vault password script {file} exited {done.returncode}: {tail[0]}")
            data = done.stdout
        else:
            data = file.read_bytes()
    except OSError as exc:
        raise VaultError(f"vault password file {file}: {exc.strerror or exc}") from None
    password = data.strip().splitlines()[0].strip() if data.strip() else b""
    if not password:
        raise VaultError(f"vault password file {file} is empty")
    return VaultSecret(label, password)


def parse_vault_id(value: str) -> tuple[str, str]:
    """``label@source`` -> (label, source); a bare source has label 'default'."""
    label, at, source = value.partition("@")
    return (label or "default", source) if at else ("default", value)


def mark_secret(value: Any) -> Any:
    """Every string in a value read from an encrypted file, as VaultStr (numbers stay as they are)."""
    if isinstance(value, str):
        return VaultStr(value)
    if isinstance(value, list):
        return [mark_secret(v) for v in value]
    if isinstance(value, dict):
        return {k: mark_secret(v) for k, v in value.items()}
    return value


def _register_yaml() -> None:
    import yaml

    for dumper in (yaml.SafeDumper, yaml.Dumper):
        dumper.add_representer(VaultStr, yaml.representer.SafeRepresenter.represent_str)


_register_yaml()
