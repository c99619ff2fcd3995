"""The playbook modules copy, template, venv, kernels, probe and drift without hosts: their argument
models (what the runner's schema check accepts and refuses, and which key it names), the pure
decisions (file mode, diffs with secrets masked, summaries), the once-per-run memo, and the
host-side ``remote/files.py`` run here on local files."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any, cast

import jinja2
import pytest
from pydantic import ValidationError

from fleetctl.drift.audit import Finding, Kind
from fleetctl.errors import InputError
from fleetctl.playbook.modules import MODULES, ModuleContext, RunServices
from fleetctl.playbook.modules import drift as drift_mod
from fleetctl.playbook.modules import files as files_mod
from fleetctl.playbook.modules import probe as probe_mod
from fleetctl.playbook.modules import venv as venv_mod
from fleetctl.probes import Expect
from fleetctl.secrets import MASK, mask_values, secret_values
from fleetctl.transport.agent import module_source
from fleetctl.transport.fleet import RunSettings
from fleetctl.venv_create import CreatePlan


def validate(name: str, raw: dict[str, Any]) -> Any:
    return MODULES[name].args.model_validate(raw)


def refused(name: str, raw: dict[str, Any]) -> tuple[tuple[Any, ...], str]:
    with pytest.raises(ValidationError) as err:
        validate(name, raw)
    first = err.value.errors()[0]
    return first["loc"], first["msg"]


def test_every_module_is_registered_with_help() -> None:
    for name in ("copy", "template", "venv", "kernels", "probe", "drift"):
        assert MODULES[name].doc, name
    assert MODULES["kernels"].free_form == "action"


# --- argument models -----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "raw"), [
    ("copy", {"dest": "/etc/app.conf", "content": "x\n"}),
    ("copy", {"dest": "/etc/app.conf", "src": "files/app.conf", "mode": "0640"}),
    ("copy", {"dest": "/etc/app.conf", "content": "", "mode": "1777"}),
    ("template", {"dest": "/etc/app.conf", "src": "templates/app.conf.j2", "mode": "600"}),
    ("venv", {"venv": "/root/ml-env", "lock": "fleet.lock", "wheelhouse": "wheels", "python": "3.11"}),
    ("venv", {"venv": "/root/ml-env", "requirements": "requirements.txt"}),
    ("venv", {"state": "overlay", "venv": "/root/ml-env", "from": "ct129", "packages": ["sglang*"], "direct": True}),
    ("kernels", {}),
    ("kernels", {"action": "plan", "venv": "/root/ml-env", "dir": "files/kernels", "strict": True}),
    ("probe", {"grep": "update_mamba_state", "subpath": "srt", "ignore_case": True, "expect": "present"}),
    ("probe", {"grep": ["a", "b"], "regex": True, "context": 2, "max_hits": 10, "cache": False}),
    ("probe", {"symbol": "SpeculativeAlgorithm.DFLASH", "venv": "/root/ml-env", "expect": "absent"}),
    ("probe", {"import": "sgl_kernel", "timeout": 30, "expect": "present"}),
    ("probe", {"http": "/server_info", "port": 30000, "fields": ["internal_states.0.x"], "status": 200}),
    ("probe", {"script": "probes/moe.py", "args": {"device": "NVIDIA_H200"}, "python": "/usr/bin/python3"}),
    ("drift", {"baseline": "ct129", "venv": "/root/ml-env", "packages": ["sglang*"], "verify_files": True,
               "skip": ["unsatisfied", "stack"]}),
    ("drift", {"lock": "fleet.lock"}),
])
def test_arguments_accepted(name: str, raw: dict[str, Any]) -> None:
    validate(name, raw)


@pytest.mark.parametrize(("name", "raw", "loc", "message"), [
    ("copy", {"dest": "/x", "content": "a", "bogus": 1}, ("bogus",), "Extra inputs are not permitted"),
    ("copy", {"dest": "/x", "src": "a", "content": "b"}, (), "exactly one of src (a controller file) and content"),
    ("copy", {"dest": "/x"}, (), "exactly one of src"),
    ("copy", {"dest": "etc/x", "content": "a"}, ("dest",), "expected an absolute path of a file on the host"),
    ("copy", {"dest": "/etc/", "content": "a"}, ("dest",), "expected an absolute path of a file"),
    ("copy", {"dest": "/x", "content": "a", "mode": 420}, ("mode",), 'quote it, as an octal string such as "0644"'),
    ("copy", {"dest": "/x", "content": "a", "mode": "rw-r--r--"}, ("mode",), "expected an octal string"),
    ("copy", {"dest": "/x", "content": "a", "mode": "0948"}, ("mode",), "expected an octal string"),
    ("template", {"dest": "/x"}, ("src",), "Field required"),
    ("template", {"dest": "/x", "src": "a.j2", "content": "b"}, ("content",), "Extra inputs"),
    ("venv", {"venv": "/v"}, (), "exactly one of lock and requirements"),
    ("venv", {"venv": "/v", "lock": "a", "requirements": "b"}, (), "exactly one of lock and requirements"),
    ("venv", {"venv": "relative", "lock": "a"}, ("venv",), "expected an absolute path on the host"),
    ("venv", {"venv": "/v", "lock": "a", "python": "python3"}, ("python",), "expected a version such as 3.11"),
    ("venv", {"venv": "/v", "lock": "a", "from": "ct129"}, ("from",), "not an argument of state present"),
    ("venv", {"venv": "/v", "lock": "a", "packages": ["x"]}, ("packages",), "not an argument of state present"),
    ("venv", {"state": "overlay", "venv": "/v"}, (), "state overlay needs from"),
    ("venv", {"state": "overlay", "venv": "/v", "from": "a", "lock": "x"}, ("lock",),
     "not an argument of state overlay"),
    ("venv", {"state": "absent", "venv": "/v"}, ("state",), "Input should be 'present' or 'overlay'"),
    ("kernels", {"action": "collect"}, ("action",), "Input should be 'plan'"),
    ("probe", {}, (), "exactly one of grep, symbol, import, http, script"),
    ("probe", {"symbol": "A", "import": "b"}, (), "(got symbol, import)"),
    ("probe", {"symbol": "A.B", "port": 80}, ("port",), "not an option of probe symbol"),
    ("probe", {"http": "/health", "expect": "present"}, ("expect",), "not an option of probe http (use status)"),
    ("probe", {"import": "x", "regex": True}, ("regex",), "not an option of probe import"),
    ("probe", {"symbol": "A", "cache": False}, ("cache",), "not an option of probe symbol"),
    ("probe", {"symbol": "not a name"}, ("symbol",), "bad symbol name"),
    ("probe", {"grep": ["("], "regex": True}, ("grep",), "invalid regex"),
    ("probe", {"grep": "x", "subpath": "../etc"}, ("grep",), "must be a relative path inside the package"),
    ("probe", {"import": "a b"}, ("import",), "expected MODULE[:ATTR]"),
    ("probe", {"http": "health"}, ("http",), "PATH must start with /"),
    ("probe", {"script": "p.py", "args": {"a b": "c"}}, ("script",), "expected KEY=VALUE"),
    ("probe", {"symbol": "A", "expect": "maybe"}, ("expect",), "Input should be 'present' or 'absent'"),
    ("probe", {"http": "/h", "status": 99}, ("status",), "greater than or equal to 100"),
    ("drift", {}, (), "exactly one of baseline (a host) and lock (a file)"),
    ("drift", {"baseline": "a", "lock": "b"}, (), "exactly one of baseline"),
    ("drift", {"baseline": "a", "skip": ["nope"]}, ("skip", 0), "Input should be 'version'"),
    ("drift", {"baseline": "a", "venv": "ml-env"}, ("venv",), "expected an absolute path on the hosts"),
])
def test_arguments_refused_naming_the_key(name: str, raw: dict[str, Any], loc: tuple[Any, ...], message: str) -> None:
    got_loc, got_message = refused(name, raw)
    assert got_loc == loc and message in got_message, (got_loc, got_message)


def test_probe_script_args_are_strings() -> None:
    args = validate("probe", {"script": "p.py", "args": {"batch": 8, "fast": True, "ratio": 0.5, "name": "x"}})
    assert args.args == {"batch": "8", "fast": "true", "ratio": "0.5", "name": "x"}
    assert refused("probe", {"script": "p.py", "args": {"a": [1]}})[0] == ("args", "a")


def test_probe_grep_term_may_be_one_string_and_kind_is_named() -> None:
    args = validate("probe", {"grep": "DFLASH"})
    assert (args.grep, args.kind) == (["DFLASH"], "grep")
    assert validate("probe", {"import": "x"}).kind == "import"


# --- files: pure decisions -----------------------------------------------------------------------

def now(text: bytes | None, mode: int | None = 0o640, size: int | None = None) -> files_mod.HostFile:
    if text is None:
        return files_mod.HostFile(False, None, None, None, None, None, "/etc", True)
    return files_mod.HostFile(True, "file", mode, size if size is not None else len(text),
                              hashlib.sha256(text).hexdigest(), files_mod.as_text(text), "/etc", True)


def test_mode_strings() -> None:
    assert files_mod.parse_mode("0644") == files_mod.parse_mode("644") == 0o644
    assert files_mod.parse_mode("01777") == 0o1777
    assert files_mod.format_mode(0o600) == "0600" and files_mod.format_mode(None) == "-"
    with pytest.raises(ValueError):
        files_mod.parse_mode("888")


def test_plan_mode_rules() -> None:
    plan = files_mod.plan_file
    assert plan(now(None), b"x", None, False).mode == 0o644  # a new file
    assert plan(now(None), b"x", None, True).mode == 0o600  # a new file holding a secret
    assert plan(now(b"x", 0o640), b"x", None, False) == files_mod.FilePlan(False, False, 0o640, 0o640)  # kept
    assert not plan(now(b"x", 0o640), b"x", None, False).changed
    tightened = plan(now(b"x", 0o644), b"x", None, True)  # a secret is never left readable by others
    assert tightened.changed and not tightened.content and tightened.mode == 0o600
    assert plan(now(b"x", 0o600), b"x", 0o644, True).mode == 0o644  # an explicit mode wins
    assert plan(now(b"x"), b"y", None, False).content


def test_secret_values_masked_longest_first() -> None:
    host_vars = {"secret_vars": ["a", "b", "empty", "absent"], "a": "tok", "b": "tok-longer", "empty": "", "c": "no"}
    secrets = secret_values(host_vars)
    assert secrets == ["tok-longer", "tok"]
    assert mask_values("x=tok-longer y=tok z=no", secrets) == f"x={MASK} y={MASK} z=no"
    assert files_mod.holds_secret(b"T=tok\n", secrets) and not files_mod.holds_secret(b"T=to\n", secrets)
    assert secret_values({"secret_vars": "a", "a": 42}) == ["42"]


def test_diff_masks_current_and_rotated_secrets() -> None:
    secrets = ["NEWSECRET"]
    old = b"A=1\nTOKEN=OLDSECRET\nB=2\n"
    new = b"A=1\nTOKEN=NEWSECRET\nB=2\n"
    plan = files_mod.plan_file(now(old, 0o600), new, None, True)
    diff = files_mod.file_diff("/etc/app.env", now(old, 0o600), new, plan, secrets)
    assert "SECRET" not in diff and diff.endswith("content differs only in secret values (masked)\n")
    # a replaced line of another shape is hidden whole; an unrelated edit stays readable
    old2 = b"A=1\nKEY OLDSECRET\nB=2\n"
    new2 = b"A=2\nTOKEN=NEWSECRET\nB=2\n"
    diff2 = files_mod.file_diff("/e", now(old2), new2, files_mod.plan_file(now(old2), new2, 0o640, True), secrets)
    assert "SECRET" not in diff2
    assert f"-A=1\n-{MASK}\n+A=2\n+TOKEN={MASK}\n" in diff2


def test_diff_of_new_binary_large_and_mode_only() -> None:
    created = files_mod.plan_file(now(None), b"a\n", 0o600, False)
    diff = files_mod.file_diff("/etc/x", now(None), b"a\n", created, [])
    assert diff.startswith("mode: - -> 0600\n--- /dev/null\n+++ b/etc/x\n") and diff.endswith("+a\n")
    binary = files_mod.file_diff("/x", now(b"a\n", 0o644), b"\0\1", files_mod.plan_file(now(b"a\n", 0o644),
                                                                                         b"\0\1", None, False), [])
    assert binary.startswith("content differs (binary; sha256 ")
    secret = files_mod.file_diff("/x", now(None), b"\0tok", files_mod.plan_file(now(None), b"\0tok", None, True),
                                 ["tok"])
    assert secret == "mode: - -> 0600\ncontent differs (binary)\n"  # no hash of a secret's content
    big = now(b"a\n", 0o644, size=files_mod.MAX_DIFF_TEXT + 1)
    big = files_mod.HostFile(**{**big.__dict__, "text": None})
    large = files_mod.file_diff("/x", big, b"b\n", files_mod.plan_file(big, b"b\n", None, False), [])
    assert f"({files_mod.MAX_DIFF_TEXT + 1} B on the host, not diffed;" in large
    mode_only = files_mod.plan_file(now(b"a\n", 0o644), b"a\n", 0o600, False)
    assert files_mod.file_diff("/x", now(b"a\n"), b"a\n", mode_only, []) == "mode: 0644 -> 0600\n"
    assert files_mod.plan_message("/x", mode_only, 2, True) == "would update the mode of /x: 0644 -> 0600"
    assert files_mod.plan_message("/x", created, 2, False) == "created /x (2 B, mode 0600)"


def _mc(tmp_path: Path, host_vars: dict[str, Any]) -> ModuleContext:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    run = RunServices(cast(Any, None), RunSettings(), {}, lambda t, v: env.from_string(t).render(v),
                      lambda e, v: env.compile_expression(e)(v), {})
    return ModuleContext(cast(Any, None), host_vars, False, True, tmp_path, run)


def test_template_errors_name_file_and_line(tmp_path: Path) -> None:
    mc = _mc(tmp_path, {"port": 30000})
    (tmp_path / "ok.j2").write_text("port={{ port }}\n")
    assert files_mod.render_template(mc, mc.path("ok.j2")) == "port=30000\n"
    (tmp_path / "undef.j2").write_text("a\nb\n{{ nope }}\n")
    with pytest.raises(InputError, match=r"undef\.j2:3: UndefinedError: 'nope' is undefined"):
        files_mod.render_template(mc, mc.path("undef.j2"))
    (tmp_path / "syntax.j2").write_text("a\n{% if %}\n")
    with pytest.raises(InputError, match=r"syntax\.j2:2: TemplateSyntaxError: "):
        files_mod.render_template(mc, mc.path("syntax.j2"))
    with pytest.raises(InputError, match=r"missing\.j2: cannot read it"):
        files_mod.render_template(mc, mc.path("missing.j2"))
    with pytest.raises(InputError, match="a folder"):
        files_mod.read_source(tmp_path, "src")


# --- files: the host side, run here --------------------------------------------------------------

@pytest.fixture(scope="module")
def remote_files() -> dict[str, Any]:
    """``remote/files.py`` exactly as the agent runs it (with its relocate include)."""
    source, _ = module_source("files")
    ns: dict[str, Any] = {"__name__": "fleetctl_remote_files"}
    exec(compile(source, "<fleetctl-remote:files>", "exec"), ns)  # noqa: S102  (our own host-side module)
    return ns


def test_remote_stat_answers(remote_files: dict[str, Any], tmp_path: Path) -> None:
    main = remote_files["main"]
    (tmp_path / "t.conf").write_text("a=1\n")
    (tmp_path / "t.conf").chmod(0o640)
    (tmp_path / "b.bin").write_bytes(b"\0\1")
    st = main({"action": "stat", "path": str(tmp_path / "t.conf"), "max_text": 100})
    assert (st["exists"], st["kind"], st["mode"], st["size"], st["text"]) == (True, "file", 0o640, 4, "a=1\n")
    assert st["sha256"] == hashlib.sha256(b"a=1\n").hexdigest()
    assert main({"action": "stat", "path": str(tmp_path / "t.conf"), "max_text": 3})["text"] is None
    assert main({"action": "stat", "path": str(tmp_path / "b.bin"), "max_text": 100})["text"] is None
    missing = main({"action": "stat", "path": str(tmp_path / "no" / "x"), "max_text": 100})
    assert (missing["exists"], missing["parent_exists"], missing["parent"]) == (False, False, str(tmp_path / "no"))
    assert main({"action": "stat", "path": str(tmp_path), "max_text": 1})["kind"] == "directory"
    with pytest.raises(remote_files["FilesError"], match="not an absolute path"):
        main({"action": "stat", "path": "relative", "max_text": 1})


def _write(main: Any, path: Path, data: bytes, mode: int, expect: str | None) -> dict[str, Any]:
    import base64

    return cast(dict[str, Any], main({"action": "write", "path": str(path), "data_b64": base64.b64encode(data).decode(),
                                      "mode": mode, "expect_sha256": expect}))


def test_remote_write_is_atomic_exact_mode_and_refuses_races(remote_files: dict[str, Any], tmp_path: Path) -> None:
    main, error = remote_files["main"], remote_files["FilesError"]
    target = tmp_path / "app.env"
    old = os.umask(0o077)  # the exact mode asked for, whatever the agent's umask
    try:
        out = _write(main, target, b"T=1\n", 0o644, None)
    finally:
        os.umask(old)
    assert (target.read_bytes(), target.stat().st_mode & 0o7777, out["mode"]) == (b"T=1\n", 0o644, 0o644)
    inode = target.stat().st_ino
    _write(main, target, b"T=2\n", 0o600, hashlib.sha256(b"T=1\n").hexdigest())
    assert target.stat().st_ino != inode and target.stat().st_mode & 0o7777 == 0o600  # a new file, renamed over
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.env"]  # no temporary file left
    with pytest.raises(error, match="changed on the host while this task ran; nothing written"):
        _write(main, target, b"T=3\n", 0o600, hashlib.sha256(b"T=1\n").hexdigest())
    with pytest.raises(error, match="changed on the host"):
        _write(main, tmp_path / "new", b"x", 0o600, "0" * 64)
    assert target.read_bytes() == b"T=2\n" and not (tmp_path / "new").exists()
    with pytest.raises(error, match=f"parent folder {tmp_path}/no does not exist"):
        _write(main, tmp_path / "no" / "x", b"x", 0o644, None)
    assert not (tmp_path / "no").exists()
    with pytest.raises(error, match="is a folder"):
        _write(main, tmp_path, b"x", 0o644, None)


def test_remote_write_goes_through_a_symlink(remote_files: dict[str, Any], tmp_path: Path) -> None:
    real = tmp_path / "real.conf"
    real.write_bytes(b"a\n")
    link = tmp_path / "link.conf"
    link.symlink_to(real)
    st = remote_files["main"]({"action": "stat", "path": str(link), "max_text": 10})
    assert st["text"] == "a\n" and st["real_path"] == str(real)
    _write(remote_files["main"], link, b"b\n", 0o644, st["sha256"])
    assert link.is_symlink() and real.read_bytes() == b"b\n"


# --- the once-per-run memo -----------------------------------------------------------------------

def test_once_computes_once_for_all_hosts_and_keeps_errors() -> None:
    run = RunServices(cast(Any, None), RunSettings(), {}, lambda t, v: t, lambda e, v: e, {})
    calls: list[int] = []

    def slow() -> int:
        calls.append(1)
        time.sleep(0.05)
        return 42

    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(drift_mod.once(run, "k", slow))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [42] * 8 and len(calls) == 1
    assert drift_mod.once(run, "other", lambda: 7) == 7

    def broken() -> int:
        calls.append(2)
        raise InputError("baseline gone")

    for _ in range(3):
        with pytest.raises(InputError, match="baseline gone"):
            drift_mod.once(run, "bad", broken)
    assert calls.count(2) == 1


# --- summaries -----------------------------------------------------------------------------------

def test_drift_summary_counts_drift_not_information() -> None:
    findings = [Finding("h", Kind.VERSION, "sglang", "0.5.23", "0.5.9", "sglang 0.5.9, baseline 0.5.23"),
                Finding("h", Kind.OVERLAY, "idna", None, "3.7", "idna 3.7: overlay from a:/v at t")]
    assert drift_mod.summary(findings, "host ct129") == "1 findings vs host ct129: sglang 0.5.9, baseline 0.5.23"
    assert drift_mod.summary(findings[1:], "host ct129") == "no drift from host ct129"
    many = [Finding("h", Kind.EXTRA, f"p{i}", None, "1", f"p{i} 1 is not in the baseline") for i in range(5)]
    assert drift_mod.summary(many, "lock x").endswith("p2 1 is not in the baseline (+2 more)")


def test_probe_expectations() -> None:
    answer = probe_mod.Answer({}, "", present=True)
    assert answer.holds(Expect.PRESENT) is True and answer.holds(Expect.ABSENT) is False
    # grep: "absent" means no term matched, not "some term missing"
    some = probe_mod.Answer({}, "", present=False, absent=False)
    assert some.holds(Expect.PRESENT) is False and some.holds(Expect.ABSENT) is False
    assert probe_mod.Answer({}, "").holds(Expect.PRESENT) is None  # http / script: no such question


def test_venv_plan_lines() -> None:
    plan = CreatePlan("pip", True, ("idna==3.7",), ("six",), (), True)
    assert venv_mod.plan_lines(plan, "/v") == "create /v (pip)\n+ idna==3.7\n- six\n"
