"""The agent's start code keeps the compiled agent in its private code cache (issue 37)."""

from __future__ import annotations

import ast
import json
import marshal
import os
import struct
import subprocess
import sys
from pathlib import Path

from fleetctl.transport.agent import MAGIC, AgentClient, module_source
from fleetctl.transport.agent_boot import AGENT_CODE_CACHE, STUB, start_code
from fleetctl.transport.local import LocalConnector


def _hello(code: str) -> dict:
    """The agent's unasked first answer (what a ping says), from ``python3 -c code`` with no input."""
    out = subprocess.run(["/usr/bin/python3", "-c", code], stdin=subprocess.DEVNULL, capture_output=True,
                         timeout=60, check=True).stdout
    frames = out[out.index(MAGIC) + len(MAGIC):]
    size = struct.unpack(">I", frames[:4])[0]
    return json.loads(frames[4:4 + size])["result"]


def test_agent_code_is_compiled_once_and_kept_private(tmp_path: Path) -> None:
    source, digest = module_source("agent")
    folder = tmp_path / "code"
    code = start_code(source, digest, "fleetctl_agent", str(folder))
    real = os.uname().nodename
    assert _hello(code)["hostname"] == real
    kept = folder / f"agent-{digest}-{sys.implementation.cache_tag}.code"
    assert kept.is_file() and oct(folder.stat().st_mode & 0o777) == "0o700"
    assert [p.name for p in folder.iterdir()] == [kept.name]  # written whole, then renamed: no leftovers
    # What the next start finds there is what it runs: the cache, not a recompile.
    planted = source.replace('"hostname": os.uname().nodename', '"hostname": "from-the-cache"')
    assert planted != source
    kept.write_bytes(marshal.dumps(compile(planted, "<planted>", "exec")))
    assert _hello(code)["hostname"] == "from-the-cache"
    # A folder others may write, or one of another user, is not trusted: its files would be executed.
    folder.chmod(0o770)
    assert _hello(code)["hostname"] == real
    folder.chmod(0o700)
    os.chown(folder, 65534, -1)
    assert _hello(code)["hostname"] == real
    os.chown(folder, os.getuid(), -1)
    # Anything unreadable there (not code, cut short) means compiling the shipped source.
    for junk in (marshal.dumps(42), b"\xe3\x00", b""):
        kept.write_bytes(junk)
        assert _hello(code)["hostname"] == real


def test_agent_start_code_uses_the_agents_own_cache_folder() -> None:
    """By default the start code keeps the agent beside the agent's module code (CODE_CACHE)."""
    from fleetctl.remote import agent as remote_agent  # type: ignore[attr-defined]

    assert eval(AGENT_CODE_CACHE, {"os": os}) == remote_agent.CODE_CACHE  # noqa: S307 - our own expression
    _, digest = module_source("agent")
    client = AgentClient("local", LocalConnector("local"), ["/usr/bin/python3"])
    try:
        assert client.call("selftest", {"action": "echo", "data": 1})
    finally:
        client.close()
    assert (Path(remote_agent.CODE_CACHE) / f"agent-{digest}-{sys.implementation.cache_tag}.code").is_file()


def test_agent_start_code_is_python38() -> None:
    """The start code runs on the host before the agent: Python >= 3.8, as the agent."""
    ast.parse(STUB.replace("FOLDER", AGENT_CODE_CACHE), feature_version=(3, 8))
    source, digest = module_source("agent")
    ast.parse(start_code(source, digest, "fleetctl_agent"), feature_version=(3, 8))
