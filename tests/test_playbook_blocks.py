"""Blocks, delegation and the modules a drain needs, on local-connection hosts (no SSH): block /
rescue / always, delegate_to localhost with the current host's variables, run_once with
batch_hosts, local_action, uri against a stand-in load balancer, wait_for, command (argv), and a
host that failed a play left out of the later plays."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli
from lb_support import load_balancer

INVENTORY = """\
all:
  vars:
    ansible_connection: local
    ansible_python_interpreter: /usr/bin/python3
  children:
    web:
      hosts:
        one: {n: 1}
        two: {n: 2}
        three: {n: 3}
"""
HOSTS = ["one", "two", "three"]


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    return path


def book(tmp_path: Path, plays: list[dict[str, Any]]) -> Path:
    path = tmp_path / "book.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return path


def run(capsys: pytest.CaptureFixture[str], inv: Path, *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(inv), "run", *args)


def names(doc: dict[str, Any], host: str) -> list[tuple[str, str]]:
    return [(r["name"], r["status"]) for r in doc["results"][host]]


def drain_play(url: str, **play: Any) -> dict[str, Any]:
    return {"name": "drained deploy", "hosts": "web", **play, "tasks": [{
        "block": [
            {"name": "drain", "uri": {"url": f"{url}/drain/{{{{ inventory_hostname }}}}", "method": "POST"},
             "delegate_to": "localhost"},
            {"name": "deploy", "shell": "true"},
            {"name": "smoke", "fail": "smoke failed", "when": "inventory_hostname in broken"},
        ],
        "rescue": [{"name": "note", "shell": "true"}, {"name": "fail again", "fail": "rescued but failed",
                                                       "when": "fail_rescue"}],
        "always": [{"name": "undrain", "local_action": {"module": "uri", "url": f"{url}/undrain/"
                                                        "{{ inventory_hostname }}", "method": "POST"}}],
    }, {"name": "after", "shell": "true"}]}


def test_drain_block_rescue_always(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with load_balancer(HOSTS) as lb:
        path = book(tmp_path, [drain_play(lb.url, serial=1)])
        ok = run(capsys, inv, str(path), "-e", '{"broken": [], "fail_rescue": false}', "--json")
        assert ok.rc == 0, ok.err
        assert lb.pool == set(HOSTS)
        order = [e.split()[1] for e in lb.log[::2]]  # one host at a time: drained, then back
        assert sorted(order) == sorted(HOSTS) and lb.log == [f"{a} {h}" for h in order for a in ("drain", "undrain")]
        assert names(ok.json(), "one") == [("drain", "changed"), ("deploy", "changed"), ("smoke", "skipped"),
                                           ("undrain", "changed"), ("after", "changed")]
        # two fails; its rescue succeeds: rescued, not failed, and it goes on with the play
        lb.log.clear()
        res = run(capsys, inv, str(path), "-e", '{"broken": ["two"], "fail_rescue": false}', "--json")
        doc = res.json()
        assert res.rc == 0, res.err
        assert doc["recap"]["two"]["failed"] == 0 and doc["recap"]["two"]["rescued"] == 1
        assert names(doc, "two")[-4:] == [("note", "changed"), ("fail again", "skipped"), ("undrain", "changed"),
                                          ("after", "changed")]
        assert lb.pool == set(HOSTS)
        # the rescue fails too: the host fails, always still undrains it, the batch's budget stops the rest
        lb.log.clear()
        bad = run(capsys, inv, str(book(tmp_path, [drain_play(lb.url, serial=1, max_failures=0)])),
                  "-e", '{"broken": ["two"], "fail_rescue": true}', "--json")
        doc = bad.json()
        assert bad.rc == 2 and doc["status"] == "halted"
        assert lb.pool == set(HOSTS) and lb.log[-2:] == ["drain two", "undrain two"]
        assert ("undrain", "changed") in names(doc, "two") and ("after", "failed") not in names(doc, "two")
        assert doc["recap"]["two"]["failed"] == 2
        assert [e for e in lb.log if "two" in e] == ["drain two", "undrain two"]


def test_delegate_to_uses_this_hosts_vars_run_once_and_batch_hosts(inv: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    path = book(tmp_path, [{"hosts": "web", "serial": 2, "tasks": [
        # each host's n, written by the controller (localhost) for the host it runs for
        {"name": "on the controller", "shell": f"echo {{{{ n }}}} > {out}/{{{{ inventory_hostname }}}}",
         "delegate_to": "localhost"},
        # run_once: one run per batch, every host of it gets the result
        {"name": "once", "shell": f"echo {{{{ batch_hosts | join(',') }}}} >> {out}/once",
         "run_once": True, "register": "o"},
        {"assert": {"that": "o.rc == 0"}},
        {"name": "delegated to another inventory host", "shell": "echo {{ inventory_hostname }}",
         "delegate_to": "one", "register": "d"},
        {"assert": {"that": "d.stdout.strip() == inventory_hostname"}},
    ]}])
    r = run(capsys, inv, str(path), "--json")
    assert r.rc == 0, r.err
    assert {h: (out / h).read_text().strip() for h in HOSTS} == {"one": "1", "two": "2", "three": "3"}
    assert (out / "once").read_text().split() == ["one,three", "two"]  # the pattern orders hosts by name
    doc = r.json()
    assert all(doc["recap"][h]["failed"] == 0 for h in HOSTS)
    unknown = run(capsys, inv, str(book(tmp_path, [{"hosts": "one", "tasks": [
        {"shell": "true", "delegate_to": "nowhere"}]}])), "--json")
    assert unknown.rc == 2 and "'nowhere' is not an inventory host" in unknown.json()["results"]["one"][0]["msg"]


def test_uri_status_and_wait_for(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flag = tmp_path / "ready"
    with load_balancer(HOSTS) as lb, socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free_port = closed.getsockname()[1]
        path = book(tmp_path, [{"hosts": "one", "tasks": [
            {"name": "pool", "uri": f"{lb.url}/pool", "register": "p"},
            {"assert": {"that": "p.json | length == 3 and p.status == 200"}},
            {"name": "404 expected", "uri": {"url": f"{lb.url}/nope", "method": "POST", "body": {"a": 1},
                                             "status_code": 404}},
            {"name": "404 unexpected", "uri": {"url": f"{lb.url}/nope", "method": "POST"}, "ignore_errors": True,
             "register": "u"},
            {"assert": {"that": "u.failed and u.status == 404"}},
            {"name": "port up", "wait_for": {"port": int(lb.url.rsplit(":", 1)[1]), "timeout": 5}},
            {"name": "port down", "wait_for": {"port": free_port, "state": "stopped", "timeout": 5}},
            {"name": "file", "shell": f"sleep 1; touch {flag}"},
            {"name": "path", "wait_for": {"path": str(flag), "timeout": 5}},
            {"name": "never", "wait_for": {"port": free_port, "timeout": 1}, "ignore_errors": True},
            {"name": "argv", "command": ["printf", "%s|", "a b", "$HOME"], "register": "c"},
            {"assert": {"that": "c.stdout == 'a b|$HOME|'"}},
        ]}])
        r = run(capsys, inv, str(path), "--json")
    doc = r.json()
    assert r.rc == 0, r.out + r.err
    never = next(x for x in doc["results"]["one"] if x["name"] == "never")
    assert never["status"] == "ignored" and never["msg"].startswith(f"127.0.0.1:{free_port} still stopped after 1s")


def test_a_host_that_failed_a_play_is_left_out_of_later_plays(inv: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = book(tmp_path, [{"name": "stage", "hosts": "web", "tasks": [
        {"fail": "bad", "when": "inventory_hostname == 'two'"}]},
        {"name": "roll", "hosts": "web", "tasks": [{"name": "go", "shell": "true"}]}])
    r = run(capsys, inv, str(path), "--json")
    doc = r.json()
    assert r.rc == 2
    assert [n for n, _ in names(doc, "two")] == ["fail bad"]
    assert ("go", "changed") in names(doc, "one")


def test_block_schema_errors(inv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = run(capsys, inv, str(book(tmp_path, [{"hosts": "web", "tasks": [
        {"block": [{"shell": "true"}], "shell": "true"}]}])))
    assert bad.rc == 3 and "shell: not a block key" in bad.err
    empty = run(capsys, inv, str(book(tmp_path, [{"hosts": "web", "tasks": [{"block": []}]}])))
    assert empty.rc == 3 and "block: a list of tasks (at least one)" in empty.err
    inner = run(capsys, inv, str(book(tmp_path, [{"hosts": "web", "tasks": [
        {"block": [{"shell": "true"}, {"nope": 1}]}]}])))
    assert inner.rc == 3 and "book.yml:5" in inner.err and "nope: unknown module" in inner.err
