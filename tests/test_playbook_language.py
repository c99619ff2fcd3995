"""Ansible's playbook language in fleetctl (issue 22), on local-connection hosts with real commands:
loops, handlers, roles, includes, vars_files (vault too), import_playbook, changed_when/failed_when,
no_log, environment, args, set_fact, debug, file, lineinfile, fetch, gather_facts; and what the
playbook loader refuses (one line naming file:line and the key)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli

from fleetctl.vault import encrypt

INVENTORY = """\
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: /usr/bin/python3
  children:
    web:
      hosts:
        one: {n: 1, color: inventory}
        two: {n: 2}
"""


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    return path


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def book(tmp_path: Path, tasks: list[dict[str, Any]], **play: Any) -> Path:
    return write(tmp_path / "book.yml", [{"name": "p", "hosts": "web", **play, "tasks": tasks}])


def run(capsys: pytest.CaptureFixture[str], inv: Path, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(inv), "run", *args)


def results(doc: dict[str, Any], host: str) -> list[dict[str, Any]]:
    return doc["results"][host]


def named(doc: dict[str, Any], host: str, name: str) -> dict[str, Any]:
    return next(r for r in doc["results"][host] if r["name"] == name)


def order(doc: dict[str, Any], host: str) -> list[str]:
    return [r["name"] for r in doc["results"][host]]


# --- loops ------------------------------------------------------------------------------------------

def test_loop_with_items_and_loop_control(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    path = book(tmp_path, [
        {"name": "loop", "shell": f"echo {{{{ fruit }}}}-{{{{ i }}}} >> {out}/{{{{ inventory_hostname }}}}",
         "loop": ["apple", "pear", "fig"], "loop_control": {"loop_var": "fruit", "index_var": "i",
                                                            "label": "{{ fruit | upper }}"},
         "when": "fruit != 'pear' or n == 2", "register": "r"},
        {"name": "flat", "debug": {"msg": "{{ item }}"}, "with_items": [[1, 2], 3], "register": "w"},
        {"name": "templated list", "debug": {"msg": "{{ item.key }}"}, "loop": "{{ {'a': 1, 'b': 2} | dict2items }}",
         "register": "t"},
        {"name": "empty", "debug": {"msg": "x"}, "loop": []},
        {"name": "check", "assert": {"that": [
            "r.results | length == 3", "r.results[0].fruit == 'apple'", "r.results[1].skipped == (n == 1)",
            "w.results | map(attribute='item') | list == [1, 2, 3]", "t.results[1].msg == 'b'", "r is changed"]}},
    ])
    r = run(capsys, inv, str(path), "--json")
    doc = r.json()
    assert r.rc == 0, r.err + r.out
    assert (out / "one").read_text() == "apple-0\nfig-2\n"
    assert (out / "two").read_text() == "apple-0\npear-1\nfig-2\n"
    assert "(APPLE)" in named(doc, "one", "loop")["msg"]
    assert named(doc, "one", "empty")["status"] == "skipped"
    assert doc["recap"]["one"]["changed"] == 1 and doc["recap"]["one"]["failed"] == 0


def test_a_failed_item_fails_the_task_and_the_rest_still_run(inv: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = book(tmp_path, [{"name": "items", "shell": "test {{ item }} != 2", "loop": [1, 2, 3], "register": "r",
                            "ignore_errors": True},
                           {"name": "saw", "assert": {"that": ["r.results | length == 3", "r is failed"]}}])
    r = run(capsys, inv, str(path), "--json", "-l", "one")
    doc = r.json()
    assert r.rc == 0, r.out
    assert named(doc, "one", "items")["status"] == "ignored"
    assert "one or more items failed: (2)" in named(doc, "one", "items")["msg"]


# --- handlers ------------------------------------------------------------------------------------------

def test_handlers_run_once_at_the_end_in_definition_order(inv: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    log.mkdir()
    step = f"echo {{{{ inventory_hostname }}}}:{{{{ what }}}} >> {log}/order"
    path = write(tmp_path / "book.yml", [{
        "name": "p", "hosts": "web", "serial": 2,
        "pre_tasks": [{"name": "pre", "shell": step, "vars_note": None}] if False else [
            {"name": "pre", "shell": step.replace("{{ what }}", "pre"), "notify": "second"}],
        "tasks": [
            {"name": "t1", "shell": step.replace("{{ what }}", "t1"), "notify": ["first", "second"]},
            {"name": "t2", "shell": step.replace("{{ what }}", "t2"), "notify": "first"},
            {"name": "quiet", "shell": "true", "changed_when": False, "notify": "never"},
            {"name": "only two", "shell": "true", "when": "n == 2", "notify": "listener"},
        ],
        "post_tasks": [{"name": "post", "shell": step.replace("{{ what }}", "post")}],
        "handlers": [
            {"name": "never", "shell": step.replace("{{ what }}", "never")},
            {"name": "second", "shell": step.replace("{{ what }}", "second")},
            {"name": "first", "shell": step.replace("{{ what }}", "first")},
            {"name": "heard", "shell": step.replace("{{ what }}", "heard"), "listen": "listener"},
        ]}])
    r = run(capsys, inv, str(path), "--json")
    assert r.rc == 0, r.out
    lines = (log / "order").read_text().split()
    for host in ("one", "two"):
        mine = [line.split(":")[1] for line in lines if line.startswith(host + ":")]
        # pre_tasks flush, then tasks, then handlers once each in definition order, then post_tasks
        assert mine == ["pre", "second", "t1", "t2", "second", "first", *(["heard"] if host == "two" else []),
                        "post"], (host, mine)
    doc = r.json()
    assert doc["recap"]["one"]["changed"] == 7  # pre, second, t1, t2, second, first, post


def test_meta_flush_handlers_and_a_failed_host_runs_none(inv: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = book(tmp_path, [
        {"name": "change", "shell": "true", "notify": "h"},
        {"meta": "flush_handlers"},
        {"name": "after flush", "debug": {"msg": "after"}},
        {"name": "change again", "shell": "true", "notify": "h"},
        {"name": "one fails", "fail": {"msg": "no"}, "when": "n == 1"},
    ], handlers=[{"name": "h", "debug": {"msg": "handled"}}])
    r = run(capsys, inv, str(path), "--json")
    doc = r.json()
    assert r.rc == 2
    assert order(doc, "two") == ["change", "h", "after flush", "change again", "one fails", "h"]
    assert order(doc, "one") == ["change", "h", "after flush", "change again", "one fails"]


# --- conditions, no_log, environment, args, set_fact, debug ---------------------------------------------------

def test_changed_when_failed_when_no_log_environment_args(inv: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = book(tmp_path, [
        {"name": "exit 3", "shell": "exit 3", "register": "x", "failed_when": "x.rc not in [0, 3]",
         "changed_when": False},
        {"name": "env", "shell": "echo \"$GREETING|$N\"", "register": "e",
         "environment": {"GREETING": "hi there; $(id)", "N": "{{ n }}"}},
        {"name": "args", "command": "echo", "args": {"chdir": "/tmp"}, "register": "a"},
        {"name": "args free form", "command": "pwd", "args": {"chdir": "/"}, "register": "p"},
        {"name": "hidden", "shell": "echo the-password-is-swordfish", "no_log": True, "register": "h"},
        {"name": "fact", "set_fact": {"doubled": "{{ n * 2 }}", "listed": ["{{ n }}"]}},
        {"name": "show", "debug": {"var": "doubled"}},
        {"name": "show msg", "debug": {"msg": "n={{ n }} {{ missing | default(omit) }}"}},
        {"name": "task vars", "debug": {"msg": "{{ va }}-{{ vb }}"}, "vars": {"va": "{{ n + 1 }}", "vb": "{{ va }}x"},
         "register": "tv"},
        {"name": "check", "assert": {"that": [
            "x.rc == 3", "e.stdout == 'hi there; $(id)|' ~ n", "p.stdout == '/'", "doubled == n * 2",
            "h.stdout == 'the-password-is-swordfish'", "listed == [n]",
            "tv.msg == (n + 1) ~ '-' ~ (n + 1) ~ 'x'", "va is not defined"]}},
        {"name": "fails by failed_when", "shell": "true", "failed_when": ["true", "n == 2"]},
    ])
    r = run(capsys, inv, str(path), "--json")
    doc = r.json()
    assert named(doc, "one", "exit 3")["status"] == "ok"
    assert named(doc, "one", "check")["status"] == "ok", named(doc, "one", "check")
    assert named(doc, "one", "show")["msg"] == "doubled: 2"
    assert named(doc, "two", "fails by failed_when")["status"] == "failed"
    assert named(doc, "one", "fails by failed_when")["status"] == "changed"
    assert "failed_when: true and n == 2" in named(doc, "two", "fails by failed_when")["msg"]
    assert "swordfish" not in r.out and "'no_log: true'" in named(doc, "one", "hidden")["msg"]
    journal = Path(doc["journal"]).read_text()
    assert "swordfish" not in journal


# --- includes, roles, vars_files, import_playbook ----------------------------------------------------------

def test_include_and_import_tasks(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "tasks" / "inner.yml", [{"name": "inner", "debug": {"msg": "in {{ inventory_hostname }}"}},
                                             {"import_tasks": "deeper.yml"}])
    write(tmp_path / "tasks" / "deeper.yml", [{"name": "deeper", "debug": {"msg": "deep"}}])
    path = book(tmp_path, [{"name": "inc", "include_tasks": "tasks/inner.yml", "when": "n == 2"},
                           {"import_tasks": {"file": "tasks/deeper.yml"}, "tags": ["t"]}])
    r = run(capsys, inv, str(path), "--json")
    doc = r.json()
    assert r.rc == 0, r.out
    assert [(x["name"], x["status"]) for x in results(doc, "one")] == [
        ("inner", "skipped"), ("deeper", "skipped"), ("deeper", "ok")]
    assert [x["status"] for x in results(doc, "two")] == ["ok", "ok", "ok"]
    r = run(capsys, inv, str(path), "--json", "--tags", "t")
    assert order(r.json(), "two") == ["deeper"]


def _role(tmp_path: Path) -> None:
    base = tmp_path / "roles" / "web"
    write(base / "defaults" / "main.yml", {"color": "default", "size": "small"})
    write(base / "vars" / "main.yml", {"flavor": "role"})
    write(base / "files" / "motd", "hello from the role\n")
    write(base / "templates" / "conf.j2", "{{ inventory_hostname }} {{ color }} {{ size }} {{ flavor }} "
                                          "{{ lookup('file', 'motd') }}\n")
    write(base / "tasks" / "main.yml", [
        {"name": "role copy", "copy": {"src": "motd", "dest": str(tmp_path / "{{ inventory_hostname }}.motd")},
         "notify": "role handler"},
        {"name": "role template", "template": {"src": "conf.j2",
                                               "dest": str(tmp_path / "{{ inventory_hostname }}.conf")}}])
    write(base / "handlers" / "main.yml", [{"name": "role handler", "debug": {"msg": "role handled"}}])


def test_roles_defaults_vars_files_and_handlers(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _role(tmp_path)
    path = write(tmp_path / "book.yml", [{"name": "p", "hosts": "web", "roles": [{"role": "web", "size": "large"}],
                                          "tasks": [{"name": "after role", "debug": {"msg": "{{ flavor }}"}}]}])
    r = run(capsys, inv, str(path), "--json")
    doc = r.json()
    assert r.rc == 0, r.out
    # defaults lose to the inventory (one has color), role params win over defaults
    assert (tmp_path / "one.conf").read_text() == "one inventory large role hello from the role\n"
    assert (tmp_path / "two.conf").read_text() == "two default large role hello from the role\n"
    assert order(doc, "one") == ["role copy", "role template", "after role", "role handler"]
    r = run(capsys, inv, str(path), "--json")
    assert order(r.json(), "one") == ["role copy", "role template", "after role"]  # nothing changed: no handler


def test_vars_files_with_vault_and_import_playbook(inv: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    password = write(tmp_path / "pw", "s3cret\n")
    secret_file = tmp_path / "vars" / "secret.yml"
    secret_file.parent.mkdir()
    secret_file.write_text(encrypt(b"api_token: tok-1234567890\n", b"s3cret"))
    write(tmp_path / "vars" / "plain.yml", {"region": "eu", "color": "from-vars-file"})
    write(tmp_path / "files" / "blob.txt", "")
    (tmp_path / "files" / "token.vault").write_text(encrypt(b"vaulted file body\n", b"s3cret"))
    write(tmp_path / "second.yml", [{"name": "imported", "hosts": "web", "vars_files": ["vars/plain.yml"],
                                     "tasks": [{"name": "imported task", "debug": {"msg": "{{ region }}"}}]}])
    write(tmp_path / "book.yml", [
        {"name": "p", "hosts": "web", "vars": {"color": "play"}, "vars_files": ["vars/secret.yml", "vars/plain.yml"],
         "tasks": [
             {"name": "token", "shell": "echo {{ api_token }} > " + str(tmp_path / "{{ inventory_hostname }}.tok")},
             {"name": "vault copy", "copy": {"src": "token.vault",
                                             "dest": str(tmp_path / "{{ inventory_hostname }}.v")}},
             {"name": "color", "debug": {"msg": "{{ color }} {{ lookup('file', 'token.vault') }}"}},
             {"name": "show token", "debug": {"var": "api_token"}}]},
        {"import_playbook": "second.yml"}])
    r = run_cli(capsys, "-i", str(inv), "--vault-password-file", str(password), "run", str(tmp_path / "book.yml"),
                "--json")
    doc = r.json()
    assert r.rc == 0, r.out + r.err
    assert (tmp_path / "one.tok").read_text() == "tok-1234567890\n"
    assert (tmp_path / "one.v").read_text() == "vaulted file body\n"
    assert named(doc, "one", "color")["msg"] == "from-vars-file ********"  # vars_files beat play vars
    assert named(doc, "two", "imported task")["msg"] == "eu"
    assert named(doc, "one", "show token")["msg"] == "api_token: ********"
    assert "tok-1234567890" not in r.out and "tok-1234567890" not in Path(doc["journal"]).read_text()


# --- file, lineinfile, fetch, gather_facts ----------------------------------------------------------------

def test_file_lineinfile_fetch(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "srv"
    conf = f"{base}/{{{{ inventory_hostname }}}}/app/app.conf"
    path = book(tmp_path, [
        {"name": "dir", "file": {"path": f"{base}/{{{{ inventory_hostname }}}}/app", "state": "directory",
                                 "mode": "0750"}},
        {"name": "touch", "file": {"path": conf, "state": "touch", "mode": "0640"}},
        {"name": "link", "file": {"src": conf, "dest": f"{base}/{{{{ inventory_hostname }}}}/current.conf",
                                  "state": "link"}},
        {"name": "line", "lineinfile": {"path": conf, "line": "user=web"}},
        {"name": "replace", "lineinfile": {"path": conf, "regexp": "^port=", "line": "port={{ 8000 + n }}"}},
        {"name": "before", "lineinfile": {"path": conf, "line": "# managed", "insertbefore": "BOF"}},
        {"name": "gone", "file": {"path": f"{base}/{{{{ inventory_hostname }}}}/nothing", "state": "absent",
                                  "mode": "{{ no_such_var | default(omit) }}"}},
        {"name": "fetch", "fetch": {"src": conf, "dest": "fetched"}},
    ])
    r = run(capsys, inv, str(path), "--json")
    doc = r.json()
    assert r.rc == 0, r.out
    assert (base / "one" / "app" / "app.conf").read_text() == "# managed\nuser=web\nport=8001\n"
    assert oct((base / "one" / "app").stat().st_mode & 0o777) == "0o750"
    assert os.readlink(base / "two" / "current.conf") == f"{base}/two/app/app.conf"
    assert (tmp_path / "fetched" / "two" / str(base / "two" / "app" / "app.conf").lstrip("/")).read_text() == \
        "# managed\nuser=web\nport=8002\n"
    assert [x["status"] for x in results(doc, "one")] == ["changed"] * 6 + ["ok", "changed"]
    again = run(capsys, inv, str(path), "--json").json()
    # touch always changes (Ansible's touch updates the times); the rest is idempotent
    assert [x["status"] for x in results(again, "one")] == ["ok", "changed", "ok", "ok", "ok", "ok", "ok", "ok"]


def test_gather_facts(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = book(tmp_path, [{"name": "os", "assert": {"that": "facts.cpus > 0"}}], gather_facts=True)
    r = run(capsys, inv, str(path), "--json", "-l", "one")
    assert r.rc == 0, r.out
    assert order(r.json(), "one") == ["Gathering Facts", "os"]


# --- refused at load ----------------------------------------------------------------------------------

REFUSED = [
    ({"tasks": [{"name": "x", "shell": "true", "notify": "nobody"}]}, 4, "notify: no handler named 'nobody'"),
    ({"tasks": [{"include_tasks": "missing.yml"}]}, 4, "include_tasks: "),
    ({"tasks": [{"include_tasks": "x.yml", "loop": [1]}]}, 5, "loop: not supported on include_tasks"),
    ({"tasks": [{"include_tasks": "{{ f }}.yml"}]}, 4, "include_tasks: a task file name"),
    ({"vars_files": ["{{ env }}.yml"]}, 4, "vars_files: a file name relative"),
    ({"vars_files": ["nope.yml"]}, 4, "vars_files: "),
    ({"tasks": [{"name": "x", "shell": "true", "listen": "a"}]}, 6, "listen: only a handler listens"),
    ({"tasks": [{"meta": "end_play"}]}, 4, "meta: only `meta: flush_handlers`"),
    ({"roles": ["absent_role"]}, 4, "roles: role 'absent_role' not found"),
    ({"tasks": [{"name": "x", "shell": "true", "loop_control": {"loop_var": "not a name"}}]}, 7, "loop_control"),
    ({"tasks": [{"name": "x", "shell": "true", "loop": [1], "with_items": [2]}]}, 8, "with_items: a task has one loop"),
    ({"tasks": [{"name": "x", "shell": "true", "args": "chdir=/"}]}, 6, "args: a mapping"),
    ({"strategy": "free"}, 3, "strategy: unknown key"),
    ({"tasks": [{"name": "x", "include_role": {"name": "r"}}]}, 5, "include_role: unknown module or task key"),
    ({"tasks": [{"name": "x", "lineinfile": {"path": "/etc/x", "state": "present"}}]}, 5, "lineinfile"),
    ({"tasks": [{"name": "x", "file": {"path": "relative"}}]}, 6, "file.path"),
    ({"tasks": [{"name": "x", "systemd": {"name": "a", "state": "bounced"}}]}, 7, "systemd.state"),
    ({"handlers": [{"block": [{"debug": {}}]}]}, 4, "block: not supported in a handler"),
]


@pytest.mark.parametrize(("play", "line", "message"), REFUSED, ids=[m for _, _, m in REFUSED])
def test_refused_at_load_with_file_line_and_key(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 play: dict[str, Any], line: int, message: str) -> None:
    path = write(tmp_path / "book.yml", [{"name": "p", "hosts": "web", **play}])
    r = run(capsys, inv, str(path))
    assert r.rc == 3
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fleetctl: error: {path}:{line}: ") and message in lines[0], (
        lines, path.read_text())


def test_refused_in_an_included_file_names_that_file(inv: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    inner = write(tmp_path / "inner.yml", [{"name": "ok", "debug": {}}, {"name": "bad", "shell": "x", "when": "{{"}])
    path = book(tmp_path, [{"import_tasks": "inner.yml"}])
    r = run(capsys, inv, str(path))
    assert r.rc == 3 and r.err.strip().startswith(f"fleetctl: error: {inner}:5: when: bad expression"), r.err
    write(tmp_path / "roles" / "r" / "meta" / "main.yml", {"dependencies": ["other"]})
    path = write(tmp_path / "book.yml", [{"name": "p", "hosts": "web", "roles": ["r"]}])
    r = run(capsys, inv, str(path))
    assert r.rc == 3 and "meta/main.yml:1: dependencies: role dependencies are not supported" in r.err, r.err


def test_runtime_loop_and_when_errors_name_the_included_file(inv: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    inner = write(tmp_path / "inner.yml", [{"name": "l", "debug": {}, "loop": "{{ n }}"}])
    path = book(tmp_path, [{"include_tasks": "inner.yml"}])
    r = run(capsys, inv, str(path), "-l", "one", "--json")
    assert r.rc == 2
    assert named(r.json(), "one", "l")["msg"] == f"{inner}:1: loop: expects a list, got int '1'"
