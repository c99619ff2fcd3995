"""fleetctl's inventory against real Ansible: same vars per host, same hosts per pattern.

The YAML fixture (rich/), an INI inventory (ini/), an inventory directory mixing INI, YAML, an
executable script, a subfolder and ignored names (dir/), several -i at once with a host list
(multi/), and an inventory script with and without _meta (script/) are each compared with
`ansible-inventory --list` / `--host` and `ansible PATTERN --list-hosts` (also with -l @file).

A session fixture installs ansible-core (pinned: ANSIBLE_CORE) into <repo>/.cache/ansible-venv
(reused when it is that version). It never skips: if Ansible cannot be installed, these tests
fail and say why.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from fleetctl.errors import PatternError
from fleetctl.inventory import Inventory, load_inventory

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".cache" / "ansible-venv"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "inventory"
RICH = FIXTURES / "rich" / "hosts.yml"
ANSIBLE_CORE = "2.19.14"  # what the comparison is made against; bench/peers.py allows 2.19.x
# Each case: the -i sources (several -i when more than one), and env for the inventory script.
CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    "ini": ([str(FIXTURES / "ini" / "hosts.ini")], {}),
    "dir": ([str(FIXTURES / "dir")], {}),
    "multi": ([str(FIXTURES / "multi" / "a" / "hosts.yml"), str(FIXTURES / "multi" / "b" / "hosts.ini"),
               "x1,x2:2200,"], {}),
    "script": ([str(FIXTURES / "script" / "inventory.py")], {}),
    "script-nometa": ([str(FIXTURES / "script" / "inventory.py")], {"FLEETCTL_TEST_NO_META": "1"}),
}
CASE_PATTERNS = {
    "ini": ["all", "gpu", "gpu:!rack2", "odd:&blackwell", "ungrouped", "later", "h200[1:2]", "bw*", "~ct13"],
    "dir": ["all", "h200", "storage", "cloud:!storage", "deep", "nas*"],
    "multi": ["all", "gpu", "h200", "ungrouped", "x*"],
    "script": ["all", "gpu", "legacy", "webhost", "ungrouped", "gpu:!h200"],
}
LIMIT_FILE = FIXTURES / "ini" / "limit.txt"
EXAMPLE = REPO / "inventory" / "example.yml"
EXTRA = {"rung": "extra", "nested": {"x": 1}}
ZYGOTE = Path(__file__).resolve().parent / "ansible_zygote.py"

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
    return done.returncode == 0 and f"core {ANSIBLE_CORE}]" in done.stdout


def _install_ansible(venv: Path) -> None:
    """Install ansible-core into ``venv`` unless it works already; a lock beside it keeps two pytest
    workers (or checkouts' runs) from building it at once."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _ansible_works(venv):  # the other worker built it while we waited
            return
        if venv.exists():
            shutil.rmtree(venv)
        python = shutil.which("python3") or sys.executable
        steps = [[python, "-m", "venv", str(venv)],
                 [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"ansible-core=={ANSIBLE_CORE}"]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                pytest.fail(f"cannot install ansible-core ({' '.join(step)}): {done.stderr[-2000:]}")


@pytest.fixture(scope="session")
def ansible(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
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

    def run(argv: Sequence[str], more_env: dict[str, str] | None = None) -> str:
        cmd = [str(VENV / "bin" / argv[0]), *argv[1:]]
        # cwd is scratch so no ansible.cfg or playbook-dir group_vars sneak in.
        done = subprocess.run(cmd, capture_output=True, text=True, env={**env, **(more_env or {})}, cwd=scratch,
                              timeout=120)
        assert done.returncode == 0, f"{' '.join(cmd)} failed: {done.stderr}"
        return done.stdout

    def many(calls: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, str]:
        """Each call's stdout, every one a fresh Ansible process forked after its imports
        (ansible_zygote.py): what ``run`` gives, without ~1 s of imports per call."""
        out_dir = tmp_path_factory.mktemp("ansible-calls")
        done = subprocess.run([str(VENV / "bin" / "python"), str(ZYGOTE), str(out_dir)], input=json.dumps(calls),
                              capture_output=True, text=True, env=env, cwd=scratch, timeout=600)
        assert done.returncode == 0, f"ansible_zygote.py failed: {done.stderr[-3000:]}"
        answers: dict[str, str] = {}
        for key, (code, out, err) in json.loads(done.stdout).items():
            assert code == 0, f"{' '.join(calls[key][0])} failed ({code}): {Path(err).read_text()}"
            answers[key] = Path(out).read_text()
        return answers

    run.many = many  # type: ignore[attr-defined]
    return run


@pytest.fixture(scope="session")
def answers(ansible: Callable[..., str]) -> dict[str, str]:
    """Every Ansible answer the tests need, fetched in parallel (each call costs ~1 s)."""
    inv = str(RICH)
    listing = json.loads(ansible(["ansible-inventory", "-i", inv, "--list"]))
    calls: dict[str, tuple[list[str], dict[str, str]]] = {
        f"host:{h}": (["ansible-inventory", "-i", inv, "--host", h], {}) for h in listing["_meta"]["hostvars"]
    }
    calls["example"] = (["ansible-inventory", "-i", str(EXAMPLE), "--list"], {})
    calls["extra:ct129"] = (["ansible-inventory", "-i", inv, "--host", "ct129", "-e", json.dumps(EXTRA)], {})
    for p in PATTERNS + NO_MATCH:
        calls[f"pattern:{p}"] = (["ansible", p, "-i", inv, "--list-hosts"], {})
    calls["list"] = (["ansible-inventory", "-i", inv, "--list"], {})
    results = ansible.many(calls)  # type: ignore[attr-defined]
    # The forked calls answer as a whole ansible-inventory process does (the oracle checks itself).
    assert json.loads(results["list"]) == listing
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


# --- INI, directories, scripts, several -i, -l @file ----------------------------------------


def _i(sources: list[str]) -> list[str]:
    return [arg for source in sources for arg in ("-i", source)]


@pytest.fixture(scope="session")
def case_answers(ansible: Callable[..., str]) -> dict[str, object]:
    """For every case: Ansible's --list, --host of each host, and --list-hosts of its patterns."""
    lists = ansible.many({c: (["ansible-inventory", *_i(CASES[c][0]), "--list"], CASES[c][1])  # type: ignore[attr-defined]
                          for c in CASES})
    listings = {case: json.loads(text) for case, text in lists.items()}
    calls: dict[str, tuple[list[str], dict[str, str]]] = {}
    for case, (sources, env) in CASES.items():
        for host in listings[case]["_meta"]["hostvars"]:
            calls[f"{case}/host:{host}"] = (["ansible-inventory", *_i(sources), "--host", host], env)
        for pattern in CASE_PATTERNS.get(case, []):
            calls[f"{case}/pattern:{pattern}"] = (["ansible", pattern, *_i(sources), "--list-hosts"], env)
    calls["ini/limit"] = (["ansible", "all", *_i(CASES["ini"][0]), "--list-hosts", "-l", f"@{LIMIT_FILE}"], {})
    calls["ini/limit-and"] = (["ansible", "gpu", *_i(CASES["ini"][0]), "--list-hosts", "-l",
                               f"@{LIMIT_FILE},bw01"], {})
    return {"list": listings, **ansible.many(calls)}  # type: ignore[attr-defined]


def _ours(case: str, monkeypatch: pytest.MonkeyPatch) -> Inventory:
    sources, env = CASES[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return load_inventory(sources)


@pytest.mark.parametrize("case", list(CASES))
def test_case_matches_ansible(case_answers: dict[str, object], case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = _ours(case, monkeypatch)
    listing = case_answers["list"][case]  # type: ignore[index]
    assert set(ours.hosts) == set(listing["_meta"]["hostvars"])
    for name, host in ours.hosts.items():
        assert host.vars == json.loads(case_answers[f"{case}/host:{name}"]), name  # type: ignore[arg-type]
    for name, entry in listing.items():
        if name == "_meta":
            continue
        assert set(ours.groups[name].children) == set(entry.get("children", [])), name
        if name != "all":
            assert set(ours.groups[name].hosts) == set(entry.get("hosts", [])), name
    non_empty = {g for g, grp in ours.groups.items() if grp.hosts or grp.children}
    assert non_empty - {"all"} <= set(listing)


@pytest.mark.parametrize(("case", "pattern"), [(c, p) for c, ps in CASE_PATTERNS.items() for p in ps])
def test_case_pattern_matches_ansible(case_answers: dict[str, object], case: str, pattern: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ours = _ours(case, monkeypatch)
    theirs = _listed_hosts(case_answers[f"{case}/pattern:{pattern}"])  # type: ignore[arg-type]
    assert {h.name for h in ours.select(pattern)} == theirs


def test_limit_file_matches_ansible(case_answers: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    ours = _ours("ini", monkeypatch)
    assert {h.name for h in ours.select(f"@{LIMIT_FILE}")} == _listed_hosts(case_answers["ini/limit"])  # type: ignore[arg-type]
    # Ansible's 'gpu -l @file,bw01' is the pattern intersected with the limit.
    limited = {h.name for h in ours.select(f"@{LIMIT_FILE},bw01")} & {h.name for h in ours.select("gpu")}
    assert limited == _listed_hosts(case_answers["ini/limit-and"])  # type: ignore[arg-type]
