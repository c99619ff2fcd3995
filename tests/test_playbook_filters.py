"""Ansible's filters and lookups (templating/filters.py), lineinfile's edit and systemd's plan: pure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetctl.playbook.modules.hostfiles import LineInFileArgs, edit_lines
from fleetctl.playbook.modules.system import SystemdArgs, UnitNow, plan_systemd
from fleetctl.templating import TemplateProblem, filters, render

V: dict[str, Any] = {"d": {"a": 1, "b": {"c": 2}, "l": [1]}, "s": "Hello World", "n": None, "items": [
    {"name": "x", "v": 1}, {"name": "y", "v": 2}]}

CASES = [
    ("{{ s | regex_replace('o', '0') }}", "Hell0 W0rld"),
    ("{{ s | regex_replace('(?P<w>W\\\\w+)', '<\\\\g<w>>') }}", "Hello <World>"),
    ("{{ s | regex_replace('hello', 'bye', ignorecase=True) }}", "bye World"),
    ("{{ s | regex_search('W(or)ld', '\\\\1') }}", ["or"]),
    ("{{ s | regex_search('W\\\\w+') }}", "World"),
    ("{{ s | regex_search('zzz') }}", None),
    ("{{ d | combine({'b': {'e': 3}}) }}", {"a": 1, "b": {"e": 3}, "l": [1]}),
    ("{{ d | combine({'b': {'e': 3}}, recursive=True) }}", {"a": 1, "b": {"c": 2, "e": 3}, "l": [1]}),
    ("{{ d | combine({'l': [2]}, list_merge='append') }}", {"a": 1, "b": {"c": 2}, "l": [1, 2]}),
    ("{{ [{'a': 1}, {'b': 2}] | combine }}", {"a": 1, "b": 2}),
    ("{{ {'a': 1} | dict2items }}", [{"key": "a", "value": 1}]),
    ("{{ items | items2dict(key_name='name', value_name='v') }}", {"x": 1, "y": 2}),
    ("{{ '{\"k\": [1, 2]}' | from_json }}", {"k": [1, 2]}),
    ("{{ 'k: [1, 2]' | from_yaml }}", {"k": [1, 2]}),
    ("{{ {'b': 1, 'a': [1]} | to_yaml }}", "a: [1]\nb: 1\n"),  # Ansible's flow style for leaves
    ("{{ {'a': 1} | to_nice_yaml }}", "a: 1\n"),
    ("{{ 'héllo' | b64encode }}", "aMOpbGxv"),
    ("{{ 'aMOpbGxv' | b64decode }}", "héllo"),
    ("{{ (1 > 0) | ternary('yes', 'no') }}", "yes"),
    ("{{ n | ternary('yes', 'no', 'none') }}", "none"),
    ("{{ missing | default('fallback') }}", "fallback"),
    ("{{ '' | default('fallback', true) }}", "fallback"),
    ("{{ missing | default(omit) }}", filters.OMIT),
    ("{{ missing | d(3) }}", 3),
]


@pytest.mark.parametrize(("template", "expected"), CASES, ids=[c[0] for c in CASES])
def test_filter(template: str, expected: Any) -> None:
    assert render(template, V) == expected


def test_omit_drops_the_argument() -> None:
    args = render({"a": "{{ x | default(omit) }}", "b": 1, "c": {"d": "{{ omit }}"}}, {"omit": filters.OMIT})
    assert filters.strip_omitted(args) == {"b": 1, "c": {}}


def test_lookups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_TEST_LOOKUP", "from-env")
    monkeypatch.delenv("FLEETCTL_TEST_UNSET", raising=False)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "a.txt").write_text("in files\n\n")
    (tmp_path / "b.txt").write_text("beside")
    scope = {"playbook_dir": str(tmp_path)}
    assert render("{{ lookup('env', 'FLEETCTL_TEST_LOOKUP') }}", scope) == "from-env"
    assert render("{{ lookup('env', 'FLEETCTL_TEST_UNSET') }}", scope) == ""
    assert render("{{ lookup('env', 'FLEETCTL_TEST_UNSET', default='d') }}", scope) == "d"
    assert render("{{ lookup('file', 'a.txt') }}", scope) == "in files"
    assert render("{{ lookup('file', 'a.txt', 'b.txt') }}", scope) == "in files,beside"
    assert render("{{ query('file', 'b.txt') }}", scope) == ["beside"]
    with pytest.raises(TemplateProblem, match="lookup\\('file'\\): nope.txt not found"):
        render("{{ lookup('file', 'nope.txt') }}", scope)
    with pytest.raises(TemplateProblem, match="lookup\\('pipe'\\): not supported"):
        render("{{ lookup('pipe', 'id') }}", scope)


@pytest.mark.parametrize("template", ["{{ s | regex_replace('(') }}", "{{ 'x' | from_json }}",
                                      "{{ 1 | dict2items }}", "{{ d | combine(1) }}", "{{ missing | mandatory }}"])
def test_a_bad_input_is_a_template_problem(template: str) -> None:
    with pytest.raises(TemplateProblem):
        render(template, V)


LINES = [  # (text, args, new text, changed)
    ("a\nb\n", {"line": "c"}, "a\nb\nc\n", True),
    ("a\nb", {"line": "c"}, "a\nb\nc\n", True),
    ("a\nc\n", {"line": "c"}, "a\nc\n", False),
    ("port=1\nx\nport=2\n", {"regexp": "^port=", "line": "port=3"}, "port=1\nx\nport=3\n", True),
    ("port=1\nport=2\n", {"regexp": "^port=", "line": "port=3", "firstmatch": True}, "port=3\nport=2\n", True),
    ("a\n", {"regexp": "^port=", "line": "port=3"}, "a\nport=3\n", True),
    ("a\nb\n", {"line": "z", "insertbefore": "BOF"}, "z\na\nb\n", True),
    ("a\nb\na\n", {"line": "z", "insertafter": "^a"}, "a\nb\na\nz\n", True),
    ("a\nb\n", {"line": "z", "insertbefore": "^b"}, "a\nz\nb\n", True),
    ("a\nb\n", {"line": "z", "insertafter": "^nomatch"}, "a\nb\nz\n", True),
    ("user=bob\n", {"regexp": "^user=(\\w+)", "line": "owner=\\1", "backrefs": True}, "owner=bob\n", True),
    ("x\n", {"regexp": "^user=(\\w+)", "line": "owner=\\1", "backrefs": True}, "x\n", False),
    ("a\n#b\nc\n#d\n", {"regexp": "^#", "state": "absent"}, "a\nc\n", True),
    ("a\nb\n", {"line": "b", "state": "absent"}, "a\n", True),
    ("a key here\n", {"search_string": "key", "line": "k=v"}, "k=v\n", True),
]


@pytest.mark.parametrize(("text", "args", "new", "changed"), LINES)
def test_lineinfile_edit(text: str, args: dict[str, Any], new: str, changed: bool) -> None:
    edit = edit_lines(text, LineInFileArgs.model_validate({"path": "/f", **args}))
    assert (edit.text if changed else text) == new and edit.changed is changed


@pytest.mark.parametrize(("args", "now", "commands", "changed"), [
    ({"name": "x", "state": "started"}, UnitNow("inactive", "disabled"), [["start", "x"]], True),
    ({"name": "x", "state": "started"}, UnitNow("active", "enabled"), [], False),
    ({"name": "x", "state": "stopped"}, UnitNow("active", "enabled"), [["stop", "x"]], True),
    ({"name": "x", "state": "restarted"}, UnitNow("active", "enabled"), [["restart", "x"]], True),
    ({"name": "x", "state": "reloaded"}, UnitNow("inactive", "enabled"), [["start", "x"]], True),
    ({"name": "x", "enabled": True, "daemon_reload": True}, UnitNow("active", "disabled"),
     [["daemon-reload"], ["enable", "x"]], True),
    ({"name": "x", "enabled": False}, UnitNow("active", "disabled"), [], False),
])
def test_systemd_plan(args: dict[str, Any], now: UnitNow, commands: list[list[str]], changed: bool) -> None:
    plan = plan_systemd(SystemdArgs.model_validate(args), now)
    assert plan.commands == commands and plan.changed is changed
