"""Ansible content as a linted repo writes it, without a host: FQCN module names, and inventory values
that are templates (one naming another, one a ``lookup('env')``), rendered lazily and recursively
when a playbook or a release spec uses them; a reference loop is one error naming the variable; a
value rendered from a vault secret stays a secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.errors import InputError
from fleetctl.inventory.sources import load_inventory
from fleetctl.playbook.plays import load_playbook
from fleetctl.release.service import command, env_file, layout_for
from fleetctl.release.spec import load_spec
from fleetctl.secrets import MASK, Redactor, masked, secret_values
from fleetctl.templating import TemplateProblem, render, unsafe
from fleetctl.vault import VaultStr

FQCN_BOOK = """\
- name: linted
  hosts: all
  tasks:
    - name: say
      ansible.builtin.debug:
        msg: hi
    - name: run
      ansible.legacy.shell: uptime
    - name: unit
      ansible.builtin.systemd_service:
        name: sglang
        state: started
    - name: file
      ansible.builtin.copy:
        content: x
        dest: /tmp/x
    - ansible.builtin.set_fact:
        a: 1
    - ansible.builtin.uri:
        url: http://127.0.0.1/
    - ansible.builtin.include_tasks: more.yml
  handlers:
    - name: h
      ansible.builtin.command: "true"
"""

SPEC = """\
name: linted
version: "1"
base: {adopt: /root/ml-env}
service:
  args: [--model-path, "{{ model_path }}", --tp, "{{ tp_size }}"]
  env: {HF_TOKEN: "{{ hf_token }}", MODELS: "{{ models_root }}"}
"""


def test_fqcn_names_are_the_short_names(tmp_path: Path) -> None:
    (tmp_path / "more.yml").write_text("- ansible.builtin.command: id\n")
    (tmp_path / "book.yml").write_text(FQCN_BOOK)
    book = load_playbook(tmp_path / "book.yml")
    assert [t.module.name for t in book.tasks()][:7] == ["debug", "shell", "systemd", "copy", "set_fact", "uri",
                                                         "command"]
    assert [t.line for t in book.tasks()][:3] == [4, 7, 9]
    assert [h.module.name for h in book.plays[0].handlers] == ["command"]


@pytest.mark.parametrize("name", ["ansible.builtin.apt", "ansible.builtin.service", "ansible.legacy.release"])
def test_an_fqcn_fleetctl_lacks_is_one_line_naming_file_and_line(tmp_path: Path, name: str) -> None:
    path = tmp_path / "book.yml"
    path.write_text(f"- hosts: all\n  tasks:\n    - name: x\n      {name}:\n        name: y\n")
    with pytest.raises(InputError, match=rf"^{path}:4: {name}: fleetctl has no such module \(its Ansible "):
        load_playbook(path)


def _inventory(tmp_path: Path, group_vars: str) -> Path:
    folder = tmp_path / "inv"
    (folder / "group_vars").mkdir(parents=True)
    (folder / "hosts.yml").write_text("all:\n  children:\n    gpu:\n      hosts:\n        g1: {tp_size: 4}\n")
    (folder / "group_vars" / "gpu.yml").write_text(group_vars)
    return folder / "hosts.yml"


GROUP_VARS = """\
models_root: /models
model_path: "{{ models_root }}/qwen"
hf_token: "{{ lookup('env', 'FLEETCTL_TEST_HF_TOKEN') }}"
"""


def test_group_vars_templates_reach_a_release_specs_command_and_env(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_TEST_HF_TOKEN", "tokB")
    host_vars = load_inventory(_inventory(tmp_path, GROUP_VARS)).hosts["g1"].vars
    (tmp_path / "spec.yml").write_text(SPEC)
    spec = load_spec(tmp_path / "spec.yml")
    assert command(spec, layout_for(host_vars))[3:7] == ["--model-path", "/models/qwen", "--tp", "4"]
    env = env_file(spec, None, host_vars)
    assert "HF_TOKEN=tokB\n" in env and "MODELS=/models\n" in env and "{{" not in env


def test_playbook_values_render_lazily_and_recursively() -> None:
    variables = {"models_root": "/models", "model_path": "{{ models_root }}/qwen", "deep": "{{ model_path }}/x",
                 "unused": "{{ not_defined }}", "paths": ["{{ model_path }}", "{{ models_root }}"]}
    assert render("{{ deep }}", variables) == "/models/qwen/x"
    assert render("{{ paths }}", variables) == ["/models/qwen", "/models"]
    assert render("{{ deep is match('/models') }}", variables) is True
    # what a host answered is never a template (Ansible's unsafe text)
    assert render("{{ out.stdout }}", {"out": unsafe({"stdout": "{{ not_defined }}"})}) == "{{ not_defined }}"


@pytest.mark.parametrize(("variables", "message"), [
    ({"a": "{{ b }}", "b": "{{ a }}"}, r"^variable 'a' refers back to itself \(a -> b -> a\)$"),
    ({"a": "{{ a }}/more"}, r"^variable 'a' refers back to itself \(a -> a\)$"),
    ({"a": "{{ b }}/x", "b": "{{ nope }}"}, r"^variable 'b': UndefinedError: 'nope' is undefined"),
])
def test_a_reference_loop_or_an_undefined_name_is_one_error_naming_the_variable(variables: dict[str, str],
                                                                               message: str) -> None:
    with pytest.raises(TemplateProblem, match=message):
        render("{{ a }}", variables)


def test_a_release_spec_reference_loop_names_the_spec_key_and_the_variable(tmp_path: Path) -> None:
    (tmp_path / "spec.yml").write_text(SPEC)
    spec = load_spec(tmp_path / "spec.yml")
    loop = {"model_path": "{{ models_root }}/q", "models_root": "{{ model_path }}/..", "tp_size": 1}
    with pytest.raises(InputError, match=r"spec.yml: service.args\[1\]: variable 'model_path' refers back to "
                                         r"itself \(model_path -> models_root -> model_path\)"):
        command(spec, layout_for(loop))


def test_a_value_rendered_from_a_vault_secret_is_still_a_secret() -> None:
    host_vars = {"vault_hf_token": VaultStr("hf_s3cret"), "hf_token": "{{ vault_hf_token }}",
                 "header": "Bearer {{ hf_token }}", "plain": "{{ 'visible' }}"}
    assert isinstance(render("{{ header }}", host_vars), VaultStr)
    shown = masked(host_vars)
    assert shown["hf_token"] == MASK and shown["header"] == MASK and shown["plain"] == "{{ 'visible' }}"
    assert Redactor(secret_values(host_vars))("sent Bearer hf_s3cret") == f"sent {MASK}"


def test_a_listed_secret_that_is_a_lookup_is_masked_by_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_TEST_HF_TOKEN", "tok-from-env")
    host_vars = {"hf_token": "{{ lookup('env', 'FLEETCTL_TEST_HF_TOKEN') }}", "secret_vars": ["hf_token"]}
    assert Redactor(secret_values(host_vars))("HF_TOKEN=tok-from-env") == f"HF_TOKEN={MASK}"
