"""fleetctl's inventory against real Ansible: same vars per host, same hosts per pattern.

A session fixture installs ansible-core into <repo>/.cache/ansible-venv (reused when it works).
It never skips: if Ansible cannot be installed, these tests fail and say why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleetctl.errors import PatternError
from fleetctl.inventory import Inventory, load_inventory

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".cache" / "ansible-venv"
RICH = Path(__file__).resolve().parent / "fixtures" / "inventory" / "rich" / "hosts.yml"
EXAMPLE = REPO / "inventory" / "example.yml"
EXTRA = {"rung": "extra", "nested": {"x": 1}}

PATTERNS = [
    "all", "*", "al*", "ct1*", "gpu0?", "nas[ab]", "gpu0[!4-9]", "gpu*", "mgmt*", "node1*",
    "~ct1", "~(ct|gpu)0?1", "~.*[ab]$", "~nas|pdu",
    "gpu:storage", "gpu:&rack2", "gpu:!h200", "storage:&rack2:!nasb", "!gpu", "&gpu", "*:!ungrouped",
    "h200,storage", " h200 , storage ,odd ", "gpu,!h200", "gpu,&rack2", "rack2:&~node",
    "gpu:!blackwell:h200_canary", "!ct129:h200",
    "h200", "h200_canary", "ungrouped", "spare", "rack2_pdu", "ct129", "ct129:ct130", "loner2",
    "blackwell[0]", "blackwell[2:4]", "blackwell[-1]", "blackwell[7:]", "odd[1]", "all[0]", "all[1]",
]
# Ansible matches nothing here (it warns); fleetctl raises PatternError instead.
NO_MATCH = ["nothing", "~t1", "gpu0[1-3]", "ct[129:131]", "h200:&storage:&odd", "blackwell[20]"]


def _ansible_works(venv: Path) -> bool:
    exe = venv / "bin" / "ansible-inventory"
    if not exe.exists():
        return False
    done = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120)
    return done.returncode == 0


def _install_ansible(venv: Path) -> None:
    if venv.exists():
        shutil.rmtree(venv)
    python = shutil.which("python3") or sys.executable
    steps = [[python, "-m", "venv", str(venv)],
             [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "ansible-core"]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            pytest.fail(f"cannot install ansible-core ({' '.join(step)}): {done.stderr[-2000:]}")


@pytest.fixture(scope="session")
def ansible(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Sequence[str]], str]:
    """Run an Ansible command (name, args...) in a scratch HOME/cwd; return its stdout."""
    if not _ansible_works(VENV):
        _install_ansible(VENV)
        if not _ansible_works(VENV):
            pytest.fail(f"ansible-core in {VENV} does not run")
    scratch = tmp_path_factory.mktemp("ansible")
    env = {
        **os.environ,
        "HOME": str(scratch),
        "ANSIBLE_LOCAL_TEMP": str(scratch / "tmp"),
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        "ANSIBLE_NOCOLOR": "1",
    }
    env.pop("ANSIBLE_CONFIG", None)

    def run(argv: Sequence[str]) -> str:
        cmd = [str(VENV / "bin" / argv[0]), *argv[1:]]
        # cwd is scratch so no ansible.cfg or playbook-dir group_vars sneak in.
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=scratch, timeout=120)
        assert done.returncode == 0, f"{' '.join(cmd)} failed: {done.stderr}"
        return done.stdout

    return run


@pytest.fixture(scope="session")
def answers(ansible: Callable[[Sequence[str]], str]) -> dict[str, str]:
    """Every Ansible answer the tests need, fetched in parallel (each call costs ~1 s)."""
    inv = str(RICH)
    listing = json.loads(ansible(["ansible-inventory", "-i", inv, "--list"]))
    calls: dict[str, list[str]] = {
        f"host:{h}": ["ansible-inventory", "-i", inv, "--host", h] for h in listing["_meta"]["hostvars"]
    }
    calls["example"] = ["ansible-inventory", "-i", str(EXAMPLE), "--list"]
    calls["extra:ct129"] = ["ansible-inventory", "-i", inv, "--host", "ct129", "-e", json.dumps(EXTRA)]
    for p in PATTERNS + NO_MATCH:
        calls[f"pattern:{p}"] = ["ansible", p, "-i", inv, "--list-hosts"]
    with ThreadPoolExecutor(max_workers=max(4, (os.cpu_count() or 2) * 2)) as pool:
        results = dict(zip(calls, pool.map(ansible, calls.values()), strict=True))
    results["list"] = json.dumps(listing)
    return results


@pytest.fixture(scope="module")
def ours() -> Inventory:
    return load_inventory(RICH)


def _listed_hosts(output: str) -> set[str]:
    lines = output.splitlines()
    for i, line in enumerate(lines):
        m = re.fullmatch(r"\s*hosts \((\d+)\):", line)
        if m:
            return {name.strip() for name in lines[i + 1 : i + 1 + int(m.group(1))]}
    raise AssertionError(f"no 'hosts (N):' line in ansible output:\n{output}")


def test_same_hosts(answers: dict[str, str], ours: Inventory) -> None:
    theirs = json.loads(answers["list"])["_meta"]["hostvars"]
    assert set(ours.hosts) == set(theirs)


@pytest.mark.parametrize("name", list(load_inventory(RICH).hosts))
def test_host_vars_match_ansible(answers: dict[str, str], ours: Inventory, name: str) -> None:
    assert ours.hosts[name].vars == json.loads(answers[f"host:{name}"])
    assert ours.hosts[name].to_dict()["vars"] == json.loads(answers[f"host:{name}"])


def test_extra_vars_match_ansible(answers: dict[str, str]) -> None:
    with_extra = load_inventory(RICH, extra_vars=EXTRA)
    assert with_extra.hosts["ct129"].vars == json.loads(answers["extra:ct129"])


def test_group_structure_matches_ansible(answers: dict[str, str], ours: Inventory) -> None:
    listing = {k: v for k, v in json.loads(answers["list"]).items() if k != "_meta"}
    for name, entry in listing.items():
        assert set(ours.groups[name].children) == set(entry.get("children", [])), name
        if name != "all":  # Ansible's --list never shows hosts under 'all'
            assert set(ours.groups[name].hosts) == set(entry.get("hosts", [])), name
    non_empty = {g for g, grp in ours.groups.items() if grp.hosts or grp.children}
    assert non_empty - {"all"} <= set(listing)


def test_host_groups_match_ansible(answers: dict[str, str], ours: Inventory) -> None:
    listing = json.loads(answers["list"])
    parents: dict[str, set[str]] = {}
    for name, entry in listing.items():
        for child in entry.get("children", []) if name != "_meta" else []:
            parents.setdefault(child, set()).add(name)

    def ancestors(group: str) -> set[str]:
        return set().union(*({p} | ancestors(p) for p in parents.get(group, set())))

    for host in ours.hosts.values():
        direct = {g for g, e in listing.items() if g != "_meta" and host.name in e.get("hosts", [])}
        expected = set().union(*(ancestors(g) | {g} for g in direct)) - {"all"}
        assert host.groups == tuple(sorted(expected)), host.name


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_matches_ansible(answers: dict[str, str], ours: Inventory, pattern: str) -> None:
    theirs = _listed_hosts(answers[f"pattern:{pattern}"])
    assert theirs, f"fixture pattern {pattern!r} should match something in Ansible too"
    assert {h.name for h in ours.select(pattern)} == theirs


@pytest.mark.parametrize("pattern", NO_MATCH)
def test_no_match_raises_where_ansible_finds_nothing(
    answers: dict[str, str], ours: Inventory, pattern: str
) -> None:
    assert _listed_hosts(answers[f"pattern:{pattern}"]) == set()
    with pytest.raises(PatternError, match="no hosts match"):
        ours.select(pattern)


def test_example_inventory_matches_ansible(answers: dict[str, str]) -> None:
    listing = json.loads(answers["example"])
    example = load_inventory(EXAMPLE)
    assert {h.name: h.vars for h in example.hosts.values()} == listing["_meta"]["hostvars"]
    for name, entry in listing.items():
        if name not in ("_meta", "all"):
            assert set(example.groups[name].hosts) == set(entry.get("hosts", [])), name
