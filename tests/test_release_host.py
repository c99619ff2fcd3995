"""The host side of releases on a real local filesystem (no SSH needed): hard-link clone, patched
files as new inodes, atomic switch, prune, and the lock between two agents."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fleetctl.transport.agent import AgentClient
from fleetctl.transport.local import LocalConnector


@pytest.fixture
def agent() -> Any:
    client = AgentClient("local", LocalConnector("local"), ["/usr/bin/python3"])
    yield client
    client.close()


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Any]:
    base = tmp_path / "base"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(base)], check=True)
    site = next((base / "lib").glob("python3*/site-packages"))
    (site / "pkg").mkdir()
    (site / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (base / "bin" / "tool").write_text(f"#!{base}/bin/python\nprint('hi')\n")
    return {"root": str(tmp_path / "opt"), "state_dir": str(tmp_path / "state"), "base": str(base),
            "site": str(site)}


def build(agent: AgentClient, host: dict[str, Any], rid: str, files: dict[str, str | None],
          **extra: Any) -> dict[str, Any]:
    return dict(agent.call("release_host", {
        "op": "build", "root": host["root"], "state_dir": host["state_dir"], "release_id": rid,
        "base_venv": host["base"], "site": host["site"], "files": files, "env_file": "A=1\n",
        "extra_files": {"service.json": "{}"}, "manifest": {"release_id": rid, "spec_digest": rid}, **extra}))


def tree(top: Path) -> dict[str, tuple[str, str | bytes, int]]:
    """Every entry under ``top``: a link's target, a file's bytes, and the mode of each."""
    out: dict[str, tuple[str, str | bytes, int]] = {}
    for path in sorted(top.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(top))
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path), st.st_mode)
        elif path.is_file():
            out[rel] = ("file", path.read_bytes(), st.st_mode)
        else:
            out[rel] = ("dir", "", st.st_mode)
    return out


def inodes(top: Path) -> dict[str, int]:
    return {str(p.relative_to(top)): p.lstat().st_ino for p in top.rglob("*") if p.is_file() and not p.is_symlink()}


def test_a_linked_build_is_byte_identical_to_a_copied_one_and_never_writes_the_base(
        agent: AgentClient, host: dict[str, Any]) -> None:
    base, site = Path(host["base"]), Path(host["site"])
    (site / "pkg" / "same.py").write_text("UNCHANGED = True\n")
    before = tree(base)
    patch = {"pkg/mod.py": "VALUE = 2\n", "pkg/added.py": "NEW = True\n"}
    linked = build(agent, host, "r1", patch)
    release = Path(host["root"]) / "releases" / "r1"
    made, shared = tree(release / "venv"), inodes(release / "venv")
    assert linked["copied"] == 0 and linked["clone"] == f"linked {linked['linked']} files"
    rel_site = str(site.relative_to(base))
    assert shared[f"{rel_site}/pkg/same.py"] == (site / "pkg" / "same.py").stat().st_ino  # unchanged: one inode
    for changed in (f"{rel_site}/pkg/mod.py", "bin/tool"):  # patched, relocated: files of the release's own
        assert shared[changed] != inodes(base)[changed] and (release / "venv" / changed).stat().st_nlink == 1
    assert tree(base) == before  # nothing written through a link into the base
    subprocess.run(["rm", "-rf", str(release)], check=True)
    copied = build(agent, host, "r1", patch, links=False)
    assert (copied["linked"], copied["clone"]) == (0, "copied (links off: the spec's base.links is false)")
    assert tree(release / "venv") == made  # the same bytes, modes and symlinks as the linked build
    assert not set(inodes(release / "venv").values()) & set(inodes(base).values())


def test_clone_links_and_patches_never_touch_shared_inodes(agent: AgentClient, host: dict[str, Any]) -> None:
    out = build(agent, host, "r1", {"pkg/mod.py": "VALUE = 2\n", "pkg/added.py": "NEW = True\n"})
    assert out["built"] and out["linked"] > 0 and out["copied"] == 0  # one filesystem: hard links
    release = Path(host["root"]) / "releases" / "r1" / "venv"
    site = Path(host["site"])
    rel_site = site.relative_to(host["base"])
    assert (site / "pkg" / "mod.py").read_text() == "VALUE = 1\n"  # the base is untouched
    assert (release / rel_site / "pkg" / "mod.py").read_text() == "VALUE = 2\n"
    assert os.stat(release / rel_site / "pkg" / "mod.py").st_ino != os.stat(site / "pkg" / "mod.py").st_ino
    assert (release / "bin" / "tool").read_text().startswith(f"#!{release}/bin/python")  # relocated
    assert (Path(host["base"]) / "bin" / "tool").read_text().startswith(f"#!{host['base']}/bin/python")
    manifest = json.loads((release.parent / "manifest.json").read_text())
    assert set(manifest["venv_files"]) == {f"{rel_site}/pkg/mod.py", f"{rel_site}/pkg/added.py"}
    assert oct(os.stat(release.parent / "service.env").st_mode & 0o777) == "0o600"
    assert build(agent, host, "r1", {"pkg/mod.py": "VALUE = 2\n"})["built"] is False  # same id: kept


def test_switch_is_a_symlink_rename_and_prune_keeps_current_and_previous(agent: AgentClient,
                                                                       host: dict[str, Any]) -> None:
    for rid in ("r1", "r2", "r3", "r4"):
        build(agent, host, rid, {})
    params = {"root": host["root"], "state_dir": host["state_dir"]}
    agent.call("release_host", {"op": "switch", **params, "release_id": "r1", "reason": "deploy"})
    got = agent.call("release_host", {"op": "switch", **params, "release_id": "r2", "reason": "deploy"})
    assert got == {"from": "r1", "to": "r2", "previous": "r1"}
    assert os.readlink(Path(host["root"]) / "current") == "releases/r2"
    removed = agent.call("release_host", {"op": "prune", **params, "keep": 2})["removed"]
    # the two oldest are previous (r1) and current (r2): never removed; keep still holds (issue 32 P7),
    # so the oldest of the others go
    assert removed == ["r3", "r4"]
    build(agent, host, "r4", {})
    agent.call("release_host", {"op": "switch", **params, "release_id": "r4", "reason": "deploy"})
    removed = agent.call("release_host", {"op": "prune", **params, "keep": 2})["removed"]
    assert removed == ["r1"]  # r2 is now previous, r4 current
    state = agent.call("release_host", {"op": "state", **params})
    assert (state["current"], state["previous"]) == ("r4", "r2")
    assert [r["id"] for r in state["releases"]] == ["r2", "r4"]
    assert [h["to"] for h in state["history"]] == ["r1", "r2", "r4"]
    with pytest.raises(Exception, match="release nope is not on this host"):
        agent.call("release_host", {"op": "switch", **params, "release_id": "nope"})


def test_lock_refuses_a_second_agent_and_dies_with_the_first(host: dict[str, Any]) -> None:
    params = {"op": "lock", "root": host["root"], "state_dir": host["state_dir"]}
    first = AgentClient("a", LocalConnector("a"), ["/usr/bin/python3"])
    second = AgentClient("b", LocalConnector("b"), ["/usr/bin/python3"])
    try:
        assert first.call("release_host", {**params, "holder": {"user": "alice", "pid": 1}}) == {"locked": True}
        refused = second.call("release_host", {**params, "holder": {"user": "bob"}})
        assert refused["locked"] is False and refused["holder"]["user"] == "alice"
        first.close()  # the run holding it ended (or died): the flock goes with its process
        assert second.call("release_host", {**params, "holder": {"user": "bob"}}) == {"locked": True}
    finally:
        first.close()
        second.close()


def test_a_base_built_from_a_lock_goes_with_the_last_release_that_uses_it(agent: AgentClient,
                                                                         host: dict[str, Any]) -> None:
    """ROOT/bases/<lock hash>/venv (what `base: {lock: ...}` builds) is removed by prune or remove
    once no release names it; an adopted venv outside ROOT/bases never is."""
    root = Path(host["root"])
    for digest in ("aaa", "bbb"):
        (root / "bases" / digest).mkdir(parents=True)
        subprocess.run(["cp", "-a", host["base"], str(root / "bases" / digest / "venv")], check=True)
    adopted = host["base"]
    for rid, base in (("r1", "aaa"), ("r2", "aaa"), ("r3", "bbb"), ("r4", None), ("r5", None)):
        venv = str(root / "bases" / base / "venv") if base else adopted
        site = str(next(Path(venv, "lib").glob("python3*/site-packages")))
        build(agent, dict(host, base=venv, site=site), rid, {})
    params = {"root": host["root"], "state_dir": host["state_dir"]}
    for rid in ("r1", "r4", "r5"):
        agent.call("release_host", {"op": "switch", **params, "release_id": rid, "reason": "deploy"})
    gone = agent.call("release_base", {"op": "remove", **params, "release_id": "r1"})
    assert gone["bases_removed"] == []  # r2 still uses bases/aaa
    pruned = agent.call("release_host", {"op": "prune", **params, "keep": 2})
    assert pruned == {"removed": ["r2", "r3"], "bases_removed": [f"{root}/bases/aaa", f"{root}/bases/bbb"]}
    assert not (root / "bases" / "aaa").exists() and not (root / "bases" / "bbb").exists()
    assert (Path(adopted) / "bin" / "python").exists()  # r4, r5 (current, previous) adopt it: untouched
