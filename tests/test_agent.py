"""The agent protocol on a real local process: many requests, errors, death, restart."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from lab_support import wait_gone

from fleetctl.errors import AgentError, RemoteOperationError
from fleetctl.transport.agent import AgentClient, bootstrap_command, module_source
from fleetctl.transport.local import LocalConnector

REMOTE = Path(__file__).resolve().parent.parent / "fleetctl" / "remote"


@pytest.fixture
def agent() -> AgentClient:
    client = AgentClient("local", LocalConnector("local"), ["/usr/bin/python3"])
    yield client
    client.close()


def test_remote_modules_are_stdlib_python38() -> None:
    allowed = set(sys.stdlib_module_names)
    # launch_args.py runs in a release venv to import that venv's own parser, sglang's or smg's (and
    # says so when it cannot): the one host-side module allowed imports outside the stdlib.
    exceptions = {"launch_args.py": {"sglang", "smg"}}
    for path in sorted(REMOTE.glob("*.py")):
        tree = ast.parse(path.read_text(), feature_version=(3, 8))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                top = name.split(".")[0]
                assert top in allowed | exceptions.get(path.name, set()), f"{path.name} imports non-stdlib {name}"


def test_many_requests_share_one_process(agent: AgentClient) -> None:
    pids = {agent.call("selftest", {"action": "echo", "data": i})["pid"] for i in range(50)}
    answers = [agent.call("selftest", {"action": "echo", "data": {"n": i}})["echo"] for i in range(5)]
    assert len(pids) == 1
    assert answers == [{"n": i} for i in range(5)]
    assert agent.info is not None and agent.info.python == "/usr/bin/python3"


def test_source_is_shipped_once_and_cached_by_hash(agent: AgentClient) -> None:
    sent: list[int] = []
    real_send = None

    agent.call("selftest", {"action": "echo"})
    stream = agent._stream
    assert stream is not None
    real_send = stream.send

    def counting_send(data: bytes) -> None:
        sent.append(len(data))
        real_send(data)

    stream.send = counting_send  # type: ignore[method-assign]
    for _ in range(3):
        agent.call("selftest", {"action": "echo"})
    source, _ = module_source("selftest")
    assert all(size < len(source) for size in sent), "module source was sent again"


def test_request_that_raises_returns_error_and_agent_goes_on(agent: AgentClient) -> None:
    pid = agent.call("selftest", {"action": "echo"})["pid"]
    with pytest.raises(RemoteOperationError) as err:
        agent.call("selftest", {"action": "raise", "message": "boom on host"})
    assert err.value.etype == "RuntimeError"
    assert "boom on host" in str(err.value)
    assert "Traceback" in err.value.remote_traceback
    assert agent.call("selftest", {"action": "echo"})["pid"] == pid


def test_stray_output_does_not_corrupt_the_stream(agent: AgentClient) -> None:
    assert agent.call("selftest", {"action": "noise"}) == {"quiet": True}
    assert agent.call("selftest", {"action": "echo", "data": "after"})["echo"] == "after"


def test_large_answer(agent: AgentClient) -> None:
    assert len(agent.call("selftest", {"action": "big", "size": 5_000_000})["data"]) == 5_000_000


def test_killed_agent_is_reported_then_restarted_once(agent: AgentClient) -> None:
    first = agent.call("selftest", {"action": "echo"})["pid"]
    os.kill(first, 9)
    with pytest.raises(AgentError, match="agent died"):
        agent.call("selftest", {"action": "echo"})
    second = agent.call("selftest", {"action": "echo"})["pid"]
    assert second != first
    with pytest.raises(AgentError):
        agent.call("selftest", {"action": "die"})
    with pytest.raises(AgentError, match="not restarting"):
        agent.call("selftest", {"action": "echo"})




def test_timeout_stops_the_agent_and_no_hung_agent_outlives_it(agent: AgentClient) -> None:
    pid = agent.call("selftest", {"action": "echo"})["pid"]
    with pytest.raises(AgentError, match="no answer within 0.5s"):
        agent.call("selftest", {"action": "sleep", "seconds": 60}, timeout=0.5)
    assert wait_gone([pid], 5) == [], "the hung agent is still running after its channel closed"


def test_child_interpreter_runs_module_in_a_venv(agent: AgentClient, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    got = agent.call("selftest", {"action": "interpreter"}, python=str(venv / "bin" / "python"))
    assert got["prefix"] == str(venv)
    with pytest.raises(RemoteOperationError, match="no python at /nonexistent/bin/python"):
        agent.call("selftest", {"action": "interpreter"}, python="/nonexistent/bin/python")
    with pytest.raises(RemoteOperationError, match="boom in child"):
        agent.call("selftest", {"action": "raise", "message": "boom in child"}, python=str(venv / "bin/python"))


def test_interpreter_discovery_falls_through(tmp_path: Path) -> None:
    client = AgentClient("local", LocalConnector("local"), ["/no/such/python", "python3-nope", "/usr/bin/python3"])
    try:
        assert client.ping().python == "/usr/bin/python3"
    finally:
        client.close()
    none = AgentClient("local", LocalConnector("local"), ["/no/such/python"], start_timeout=10)
    with pytest.raises(AgentError, match="no python interpreter found"):
        none.ping()


def test_noise_from_login_files_before_hello_is_skipped() -> None:
    class Noisy(LocalConnector):
        def open_stream(self, command: str):  # type: ignore[no-untyped-def]
            return super().open_stream("echo 'Welcome to lab!'; printf 'motd\\n'; " + command)

    client = AgentClient("local", Noisy("local"), ["/usr/bin/python3"])
    try:
        assert client.call("selftest", {"action": "echo", "data": 1})["echo"] == 1
    finally:
        client.close()


def test_bootstrap_quotes_interpreter_paths() -> None:
    cmd = bootstrap_command(["/opt/my env/bin/python; rm -rf /tmp/x"])
    assert "'/opt/my env/bin/python; rm -rf /tmp/x'" in cmd


def test_remote_includes_are_inlined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetctl.transport import agent as agent_mod

    (tmp_path / "helper.py").write_text("def twice(x):\n    return 2 * x\n")
    user = "# fleetctl-include: helper\n\ndef main(params):\n    return twice(params['n'])\n"
    (tmp_path / "user.py").write_text(user)
    (tmp_path / "loop_a.py").write_text("# fleetctl-include: loop_b\n")
    (tmp_path / "loop_b.py").write_text("# fleetctl-include: loop_a\n")
    monkeypatch.setattr(agent_mod, "REMOTE_DIR", tmp_path)
    agent_mod.module_source.cache_clear()
    try:
        source, _ = agent_mod.module_source("user")
        ns: dict[str, object] = {}
        exec(compile(source, "user", "exec"), ns)
        assert ns["main"]({"n": 21}) == 42  # type: ignore[operator]
        with pytest.raises(ValueError, match="include loop: loop_a -> loop_b -> loop_a"):
            agent_mod.module_source("loop_a")
    finally:
        agent_mod.module_source.cache_clear()


def _run_child(cache: Path, source: str) -> Any:
    import json as _json

    from fleetctl.remote import agent as remote_agent  # type: ignore[attr-defined]

    req = {"module": "m", "source": source, "params": {}, "begin": "<<B>>", "end": "<<E>>", "hash": "h1",
           "cache_dir": str(cache)}
    out = subprocess.run(["/usr/bin/python3", "-c", remote_agent.CHILD_RUNNER], input=_json.dumps(req).encode(),
                         capture_output=True, check=True).stdout.decode()
    return _json.loads(out[out.rindex("<<B>>") + 5:out.rindex("<<E>>")])["result"]


def test_child_reads_and_writes_json_as_the_json_module(tmp_path: Path) -> None:
    """The child runner uses json's C scanner and encoder without importing json: the same request
    seen, the same answer text written as json.dumps(..., default=str), json itself not imported."""
    import json as _json

    from fleetctl.remote import agent as remote_agent  # type: ignore[attr-defined]

    params = {"s": "caf\u00e9 \"q\" \\ \u2603 \U0001f600\n\t", "n": [0, -1, 2**70, 1.5, -0.0, 1e300, True, None],
              "nested": {"a": [{"b": []}], "": {}}}
    source = ("import math, sys\n"
              "def main(params):\n"
              "    return {'params': params, 'json_imported': 'json' in sys.modules,\n"
              "            're_imported': 're' in sys.modules,\n"
              "            'odd': [math.nan, math.inf, -math.inf, {1: 'int key', None: 'none', 2.5: 'f'}, (1, 2),\n"
              "                    object.__new__(type('Thing', (), {'__str__': lambda self: 'thing'}))]}\n")
    req = {"module": "m", "source": source, "params": params, "begin": "<<B>>", "end": "<<E>>", "hash": "h2",
           "cache_dir": str(tmp_path / "code")}
    payload = "\n " + _json.dumps(req) + "\n"
    out = subprocess.run(["/usr/bin/python3", "-c", remote_agent.CHILD_RUNNER], input=payload.encode(),
                         capture_output=True, check=True).stdout.decode()
    text = out[out.rindex("<<B>>") + 5:out.rindex("<<E>>")].strip()
    answer = _json.loads(text)
    assert answer["result"]["params"] == params
    assert answer["result"]["json_imported"] is False and answer["result"]["re_imported"] is False
    expected = {"ok": True, "result": {"params": params, "json_imported": False, "re_imported": False,
                                       "odd": [float("nan"), float("inf"), -float("inf"),
                                               {1: "int key", None: "none", 2.5: "f"}, (1, 2), "thing"]}}
    assert text == _json.dumps(expected, default=str)
    bad = subprocess.run(["/usr/bin/python3", "-c", remote_agent.CHILD_RUNNER], input=b'{"module": 1} trailing',
                         capture_output=True)
    assert bad.returncode != 0 and b"JSONDecodeError: Extra data" in bad.stderr


def test_child_ends_at_once_only_when_the_module_says_so(tmp_path: Path) -> None:
    import json as _json

    from fleetctl.remote import agent as remote_agent  # type: ignore[attr-defined]

    for flag in (True, False):
        source = ("import atexit, sys\n"
                  f"EXIT_AT_ONCE = {flag}\n"
                  "atexit.register(lambda: sys.stderr.write('tidied up\\n'))\n"
                  "def main(params):\n"
                  "    print('said on stderr')\n"
                  "    return 'answer'\n")
        req = {"module": "m", "source": source, "params": {}, "begin": "<<B>>", "end": "<<E>>", "hash": f"x{flag}",
               "cache_dir": str(tmp_path / "code")}
        proc = subprocess.run(["/usr/bin/python3", "-c", remote_agent.CHILD_RUNNER], input=_json.dumps(req).encode(),
                              capture_output=True, check=True)
        out = proc.stdout.decode()
        assert _json.loads(out[out.rindex("<<B>>") + 5:out.rindex("<<E>>")])["result"] == "answer"
        assert proc.stderr.decode() == "said on stderr\n" + ("" if flag else "tidied up\n")


def test_child_code_cache_is_used_only_when_private(tmp_path: Path) -> None:
    import marshal

    cache = tmp_path / "code"
    real = "def main(params):\n    return 'compiled'\n"
    assert _run_child(cache, real) == "compiled"
    cached = next(cache.glob("h1-cpython-*.code"))
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    # the next call of the same hash loads the cached code instead of compiling the source
    cached.write_bytes(marshal.dumps(compile("def main(params):\n    return 'cached'\n", "x", "exec")))
    assert _run_child(cache, real) == "cached"
    cache.chmod(0o777)  # a folder others can write is not trusted: its files would be executed
    assert _run_child(cache, real) == "compiled"


def test_agent_keeps_compiled_module_code_for_the_next_command() -> None:
    """A module the agent runs itself is compiled once per source and interpreter: the next agent
    (the next command) loads the compiled code from the agent's private cache instead."""
    import marshal
    import secrets

    from fleetctl.remote import agent as remote_agent  # type: ignore[attr-defined]

    digest = "test" + secrets.token_hex(6)  # a content address no real module has
    source = "def main(params):\n    return 'compiled'\n"
    cached = Path(remote_agent.CODE_CACHE) / f"{digest}-{sys.implementation.cache_tag}.code"
    try:
        for answer in ("compiled", "cached"):
            client = AgentClient("local", LocalConnector("local"), ["/usr/bin/python3"])
            try:
                assert client.call("m", source=(source, digest)) == answer
            finally:
                client.close()
            assert cached.is_file()
            assert oct(cached.parent.stat().st_mode & 0o777) == "0o700"
            # what the next agent finds there is what it runs: this is the cache, not a recompile
            cached.write_bytes(marshal.dumps(compile("def main(params):\n    return 'cached'\n", "x", "exec")))
    finally:
        cached.unlink(missing_ok=True)
