"""Ansible Vault: fixtures made by the real ansible-vault (tests/fixtures/vault/make.sh, ansible-core
2.19.14) decrypt; values are secrets (masked in output); wrong or missing passwords are one line;
and, live against the pinned ansible-vault, each side decrypts what the other encrypts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import run_cli
from test_inventory_ansible import ansible  # noqa: F401 - the session fixture (pinned ansible-core)

from fleetctl.errors import InputError
from fleetctl.inventory import load_inventory
from fleetctl.secrets import MASK, Redactor, masked
from fleetctl.vault import Vault, VaultError, VaultStr, encrypt, read_password_file

FIX = Path(__file__).resolve().parent / "fixtures" / "vault"
INV = FIX / "inventory" / "hosts.ini"


def both() -> Vault:
    return Vault([read_password_file(str(FIX / "pw-default")), read_password_file(str(FIX / "pw-prod"), "prod")])


def test_vault_values_from_ansible_vault_decrypt() -> None:
    inv = load_inventory(INV, vault=both())
    ct1, ct2 = inv.hosts["ct1"].vars, inv.hosts["ct2"].vars
    assert ct1["hf_token"] == "hf_s3cret-token-value" and isinstance(ct1["hf_token"], VaultStr)  # 1.1, inline
    assert ct1["api_key"] == "prod-api-key-9f8e7d"  # 1.2;AES256;prod, inline
    assert ct1["db_password"] == "hunter2-long-secret" and ct1["db_port"] == 5432  # a whole encrypted file
    assert ct1["host_secret"] == "ct1-only-secret" and "host_secret" not in ct2
    assert ct1["plain_var"] == "visible" and not isinstance(ct1["plain_var"], VaultStr)


def test_vault_values_are_masked_without_secret_vars() -> None:
    ct1 = load_inventory(INV, vault=both()).hosts["ct1"]
    shown = ct1.to_dict()["vars"]
    assert shown["hf_token"] == shown["api_key"] == shown["db_password"] == shown["host_secret"] == MASK
    assert shown["plain_var"] == "visible" and shown["db_port"] == 5432  # numbers of an encrypted file stay
    redact = Redactor.for_hosts([ct1.vars])
    assert redact({"out": "token=hf_s3cret-token-value key=prod-api-key-9f8e7d"}) == {"out": f"token={MASK} key={MASK}"}
    assert masked({"nested": {"k": VaultStr("abc-secret")}})["nested"] == MASK


def test_file_decrypts_with_its_label() -> None:
    text = (FIX / "files" / "secret.conf").read_text()
    assert both().decrypt(text, "secret.conf") == b"secret file line one\nsecret file line two\n"


@pytest.mark.parametrize(
    ("vault", "expected"),
    [
        (Vault(), "inline.yml:2: vault-encrypted, but no vault password was given "
                  "(--vault-password-file, --vault-id or --ask-vault-pass)"),
        (Vault([read_password_file(str(FIX / "pw-prod"), "prod")]),
         "inline.yml:2: wrong vault password: none of the given ones decrypts this (tried: prod)"),
    ],
)
def test_missing_or_wrong_password_is_one_line(vault: Vault, expected: str) -> None:
    with pytest.raises(InputError) as info:
        load_inventory(INV, vault=vault)
    assert str(info.value) == f"{FIX}/inventory/group_vars/gpu/{expected}"


def test_damaged_vault_text_is_one_line() -> None:
    with pytest.raises(VaultError, match=r"^x:1: the vault text is damaged"):
        both().decrypt("$ANSIBLE_VAULT;1.1;AES256\nzz\n", "x:1")
    with pytest.raises(VaultError, match="cipher 'AES' is not supported"):
        both().decrypt("$ANSIBLE_VAULT;1.1;AES\n00\n", "x:1")


def test_round_trip_and_executable_password_file(tmp_path: Path) -> None:
    script = tmp_path / "pass.sh"
    script.write_text("#!/bin/sh\necho from-a-script\n")
    script.chmod(0o755)
    v = Vault([read_password_file(str(script), "ops")])
    text = v.encrypt(b"payload\n")
    assert text.startswith("$ANSIBLE_VAULT;1.2;AES256;ops\n")
    assert v.decrypt(text, "t") == b"payload\n"
    assert encrypt(b"x", b"pw").startswith("$ANSIBLE_VAULT;1.1;AES256\n")


def test_cli_wrong_password_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad-pw"
    bad.write_text("nope\n")
    r = run_cli(capsys, "-i", str(INV), "--vault-password-file", str(bad), "hosts", "--json")
    assert r.rc == 3
    assert r.err.count("\n") == 1 and "wrong vault password" in r.err
    r = run_cli(capsys, "-i", str(INV), "--vault-password-file", str(FIX / "pw-default"), "--vault-id",
                f"prod@{FIX / 'pw-prod'}", "hosts", "--json")
    assert r.rc == 0, r.err
    assert "hf_s3cret" not in r.out and "prod-api-key" not in r.out and "hunter2" not in r.out
    ct1 = next(h for h in r.json()["hosts"] if h["name"] == "ct1")
    assert ct1["vars"]["hf_token"] == MASK


def test_cli_vault_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pw = ["--vault-password-file", str(FIX / "pw-default")]
    f = tmp_path / "f.txt"
    f.write_text("hello vault\n")
    assert run_cli(capsys, *pw, "vault", "encrypt", str(f)).rc == 0
    assert f.read_text().startswith("$ANSIBLE_VAULT;1.1;AES256")
    r = run_cli(capsys, *pw, "vault", "view", str(f))
    assert r.rc == 0 and r.out == "hello vault\n"
    assert run_cli(capsys, *pw, "vault", "decrypt", str(f)).rc == 0
    assert f.read_text() == "hello vault\n"
    r = run_cli(capsys, *pw, "vault", "encrypt-string", "--name", "tok", "abc")
    assert r.out.startswith("tok: !vault |\n          $ANSIBLE_VAULT;1.1;AES256\n")
    r = run_cli(capsys, "vault", "view", str(f))
    assert r.rc == 3 and "give a password" in r.err


# --- live against the pinned ansible-vault ------------------------------------------------------


def test_ansible_vault_and_fleetctl_decrypt_each_other(ansible: Callable[..., str], tmp_path: Path) -> None:  # noqa: F811
    pw, prod = str(FIX / "pw-default"), f"prod@{FIX / 'pw-prod'}"
    theirs = ansible(["ansible-vault", "encrypt_string", "--vault-id", prod, "live value é", "--name", "v"])
    body = "\n".join(line.strip() for line in theirs.splitlines()[1:])
    assert both().decrypt_str(body, "live") == "live value é"
    mine = tmp_path / "mine.yml"
    mine.write_text(both().encrypt(b"from: fleetctl\n", "prod"))
    out = ansible(["ansible-vault", "view", "--vault-id", prod, "--vault-password-file", pw, str(mine)])
    assert out == "from: fleetctl\n"
    listing = json.loads(ansible(["ansible-inventory", "-i", str(INV), "--vault-password-file", pw,
                                  "--vault-id", prod, "--host", "ct1"]))
    ours = load_inventory(INV, vault=both()).hosts["ct1"].vars
    assert set(listing) == set(ours)
    assert listing["db_password"] == ours["db_password"] and listing["db_port"] == ours["db_port"]


def test_vault_module_imports_no_crypto_until_used() -> None:
    code = "import sys, fleetctl.vault, fleetctl.secrets; print('cryptography' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    with pytest.raises(InputError):
        Vault().encrypt(b"x")


def test_playbook_vault_values_and_encrypted_copy_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A !vault play var and an encrypted copy source reach the host as plaintext; --json and the run
    journal never hold them."""
    inv = tmp_path / "inventory.yml"
    inv.write_text("all:\n  hosts:\n    ctl: {ansible_connection: local, ansible_python_interpreter: "
                   f"{sys.executable}}}\n")
    token = both().encrypt(b"pb-vault-secret-77", "prod")
    indented = "\n".join("        " + line for line in token.splitlines())
    (tmp_path / "secret.conf").write_bytes((FIX / "files" / "secret.conf").read_bytes())
    book = tmp_path / "book.yml"
    book.write_text(f"""- hosts: all
  vars:
    token: !vault |
{indented}
  tasks:
    - name: token to a file
      copy: {{content: "{{{{ token }}}}\\n", dest: "{tmp_path}/token.out"}}
    - name: encrypted source
      copy: {{src: secret.conf, dest: "{tmp_path}/secret.out"}}
    - name: echo it
      shell: echo {{{{ token }}}}
""")
    pw = ["--vault-password-file", str(FIX / "pw-default"), "--vault-id", f"prod@{FIX / 'pw-prod'}"]
    r = run_cli(capsys, "-i", str(inv), *pw, "run", str(book), "--json", "--diff")
    assert r.rc == 0, r.err
    assert (tmp_path / "token.out").read_text() == "pb-vault-secret-77\n"
    assert (tmp_path / "secret.out").read_text() == "secret file line one\nsecret file line two\n"
    assert "pb-vault-secret-77" not in r.out and "secret file line" not in r.out
    journals = list((tmp_path / ".fleetctl" / "runs").glob("*"))
    assert journals
    for journal in journals:
        text = journal.read_text()
        assert "pb-vault-secret-77" not in text and "secret file line" not in text
    r = run_cli(capsys, "-i", str(inv), "run", str(book), "--json")
    assert r.rc == 3 and "book.yml:3: vault-encrypted, but no vault password was given" in r.err


@pytest.mark.parametrize(("name", "text"), [
    ("hosts.ini", "[gpu]\nct1 hf_token=hf_ini-secret gpus=8\n\n[gpu:vars]\nrouter_key=ini-group-secret\n"),
    ("hosts", "all:\n  children:\n    gpu:\n      hosts:\n        ct1: {hf_token: hf_ini-secret, gpus: 8}\n"
              "      vars: {router_key: ini-group-secret}\n"),  # no extension: read as YAML once decrypted
])
def test_a_whole_encrypted_inventory_file_holds_secrets(tmp_path: Path, name: str, text: str) -> None:
    """An inventory file encrypted whole (INI, or YAML without an extension) gives every value as a
    secret, as group_vars files do: masked in output without secret_vars; numbers stay numbers."""
    secret = read_password_file(str(FIX / "pw-default"))
    path = tmp_path / name
    path.write_text(encrypt(text.encode(), secret.password))
    ct1 = load_inventory(path, vault=Vault([secret])).hosts["ct1"]
    assert ct1.vars["hf_token"] == "hf_ini-secret" and isinstance(ct1.vars["hf_token"], VaultStr)
    assert isinstance(ct1.vars["router_key"], VaultStr) and ct1.vars["gpus"] == 8
    shown = ct1.to_dict()["vars"]
    assert shown["hf_token"] == shown["router_key"] == MASK and shown["gpus"] == 8
