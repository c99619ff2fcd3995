"""Ansible's task keywords and variables as a linted repo uses them, run on local-connection hosts
(real commands, no SSH): play/block/role tags with --tags/--skip-tags (always, never, tagged,
untagged, all), per-task check_mode, FQCN names, group_vars values that are templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli

INVENTORY = """\
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: /usr/bin/python3
  children:
    web:
      hosts:
        one: {n: 1}
"""


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inv" / "hosts.yml"
    path.parent.mkdir()
    path.write_text(INVENTORY)
    return path


def book(tmp_path: Path, plays: list[dict[str, Any]]) -> Path:
    path = tmp_path / "book.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return path


def run(capsys: pytest.CaptureFixture[str], inv: Path, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(inv), "run", *args, "--json")


def ran(r: CliRun) -> list[str]:
    assert r.rc == 0, r.out[-2000:] + r.err
    return [x["name"] for x in r.json()["results"]["one"] if x["status"] != "skipped"]


TAGGED = [{"name": "p", "hosts": "web", "tags": ["deploy"], "tasks": [
    {"name": "plain", "shell": "true"},
    {"name": "x", "shell": "true", "tags": "x"},
    {"name": "always", "shell": "true", "tags": ["always"]},
    {"name": "never", "shell": "true", "tags": ["never"]},
    {"name": "never debug", "shell": "true", "tags": ["never", "debug"]},
    {"name": "blk", "tags": ["b"], "block": [{"name": "in block", "shell": "true"}]},
]}, {"name": "q", "hosts": "web", "tasks": [{"name": "untagged", "shell": "true"}]}]


@pytest.mark.parametrize(("args", "expected"), [
    ((), ["plain", "x", "always", "in block", "untagged"]),
    # the play's tag is every task's: never's too, so they run (Ansible's evaluate_tags)
    (("--tags", "deploy"), ["plain", "x", "always", "never", "never debug", "in block"]),
    (("--tags", "b"), ["always", "in block"]),  # a block's tag is its tasks'
    (("--tags", "debug"), ["always", "never debug"]),  # never runs when another of its tags is asked for
    (("--tags", "untagged"), ["always", "untagged"]),
    (("--tags", "tagged"), ["plain", "x", "always", "in block"]),
    (("--skip-tags", "x,deploy"), ["untagged"]),
    (("--skip-tags", "always"), ["plain", "x", "in block", "untagged"]),
    (("--tags", "all", "--skip-tags", "b"), ["plain", "x", "always", "untagged"]),
])
def test_tags_as_ansible_selects_them(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      args: tuple[str, ...], expected: list[str]) -> None:
    assert ran(run(capsys, inv, str(book(tmp_path, TAGGED)), *args)) == expected


def test_check_mode_per_task(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real, dry = tmp_path / "real", tmp_path / "dry"
    path = book(tmp_path, [{"name": "p", "hosts": "web", "tasks": [
        {"name": "always real", "ansible.builtin.copy": {"content": "r\n", "dest": str(real)}, "check_mode": False},
        {"name": "always dry", "ansible.builtin.copy": {"content": "d\n", "dest": str(dry)}, "check_mode": True},
    ]}])
    checked = run(capsys, inv, str(path), "--check")
    assert checked.rc == 0 and real.read_text() == "r\n" and not dry.exists()
    real.unlink()
    plain = run(capsys, inv, str(path))
    assert plain.rc == 0 and real.read_text() == "r\n" and not dry.exists()
    assert [x["status"] for x in plain.json()["results"]["one"]] == ["changed", "changed"]  # "would change"


def test_group_vars_templates_render_in_a_playbook(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_TEST_TOKEN", "tok-42")
    (inv.parent / "group_vars").mkdir()
    (inv.parent / "group_vars" / "web.yml").write_text(
        f"models_root: {tmp_path}/models\nmodel_path: \"{{{{ models_root }}}}/qwen\"\n"
        "token: \"{{ lookup('env', 'FLEETCTL_TEST_TOKEN') }}\"\n")
    out = tmp_path / "out"
    path = book(tmp_path, [{"name": "p", "hosts": "web", "tasks": [
        {"name": "folder", "ansible.builtin.file": {"path": "{{ model_path }}", "state": "directory"}},
        {"name": "write", "ansible.builtin.copy": {"content": "{{ model_path }} {{ token }}\n", "dest": str(out)}},
        {"name": "hostvars", "ansible.builtin.assert": {
            "that": ["hostvars[inventory_hostname].model_path == models_root + '/qwen'"]}},
    ]}])
    r = run(capsys, inv, str(path))
    assert r.rc == 0, r.out[-2000:]
    assert out.read_text() == f"{tmp_path}/models/qwen tok-42\n" and (tmp_path / "models" / "qwen").is_dir()


def test_a_variable_loop_fails_the_task_naming_the_variable(inv: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    (inv.parent / "group_vars").mkdir()
    (inv.parent / "group_vars" / "web.yml").write_text("a: \"{{ b }}\"\nb: \"{{ a }}\"\n")
    path = book(tmp_path, [{"name": "p", "hosts": "web", "tasks": [{"name": "t", "debug": {"msg": "{{ a }}"}}]}])
    r = run_cli(capsys, "-i", str(inv), "run", str(path), "--json")
    assert r.rc == 2
    assert r.json()["results"]["one"][0]["msg"] == (f"{path}:4: debug: variable 'a' refers back to itself "
                                                    "(a -> b -> a)")


def test_stat_reports_ansibles_keys(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("abc")
    (tmp_path / "f").chmod(0o640)
    (tmp_path / "l").symlink_to(tmp_path / "f")
    path = book(tmp_path, [{"name": "p", "hosts": "web", "tasks": [
        {"name": "f", "ansible.builtin.stat": {"path": str(tmp_path / "f")}, "register": "f"},
        {"name": "l", "stat": {"path": str(tmp_path / "l")}, "register": "l"},
        {"name": "gone", "stat": {"path": str(tmp_path / "gone")}, "register": "g"},
        {"name": "d", "stat": {"path": str(tmp_path), "get_checksum": False}, "register": "d"},
        {"name": "check", "assert": {"that": [
            "f.stat.exists and f.stat.isreg and not f.stat.isdir and f.stat.size == 3 and f.stat.mode == '0640'",
            "f.stat.checksum == 'a9993e364706816aba3e25717850c26c9cd0d89d'", "f.stat.uid is number",
            "f.stat.mtime is number", "l.stat.islnk and l.stat.lnk_source == f.stat.path",
            "not g.stat.exists", "d.stat.isdir and d.stat.checksum is not defined", "f is not changed"]}},
    ]}])
    r = run(capsys, inv, str(path), "--check")
    assert r.rc == 0, r.out[-3000:]


def test_get_url_verifies_the_checksum_and_is_idempotent(inv: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import hashlib

    src = tmp_path / "weights.bin"
    src.write_bytes(b"w" * 4096)
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    dest = tmp_path / "dest"
    dest.mkdir()

    def get(checksum: str, **more: Any) -> CliRun:
        return run(capsys, inv, str(book(tmp_path, [{"name": "p", "hosts": "web", "tasks": [
            {"name": "get", "ansible.builtin.get_url": {"url": f"file://{src}", "dest": f"{dest}/w.bin",
                                                        "mode": "0600", "checksum": checksum, **more}}]}])))

    first = get(f"sha256:{sha}")
    assert first.rc == 0 and first.json()["results"]["one"][0]["status"] == "changed"
    assert (dest / "w.bin").read_bytes() == src.read_bytes() and (dest / "w.bin").stat().st_mode & 0o777 == 0o600
    again = get(f"sha256:{sha}")
    assert again.json()["results"]["one"][0]["status"] == "ok"
    (dest / "w.bin").write_bytes(b"stale")
    bad = get("sha256:" + "0" * 64)
    assert bad.rc == 2 and "did not match" in bad.json()["results"]["one"][0]["msg"]
    assert (dest / "w.bin").read_bytes() == b"stale" and sorted(p.name for p in dest.iterdir()) == ["w.bin"]
    assert get(f"sha256:{sha}").json()["results"]["one"][0]["status"] == "changed"
    assert (dest / "w.bin").read_bytes() == src.read_bytes()
