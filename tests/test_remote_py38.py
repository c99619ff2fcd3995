"""Host-side code stays Python 3.8 code: every fleetctl/remote/*.py and fleetctl/lab/fake_sglang.py.

Checked statically on any machine (ruff with a py38 target, 3.8 grammar, no 3.9+ names), and run
for real (each module's shipped text, includes inlined, compiled and its top level executed) on
every interpreter from 3.8 to 3.13 this machine has; a missing 3.8 is the allowed skip.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from interpreters import NO_PY38, find_python

from fleetctl.transport.agent import module_source

REPO = Path(__file__).resolve().parent.parent
REMOTE = REPO / "fleetctl" / "remote"
FAKE_SGLANG = REPO / "fleetctl" / "lab" / "fake_sglang.py"
FAKE_SGLANG_API = FAKE_SGLANG.with_name("fake_sglang_api.py")
HOST_FILES = [*sorted(REMOTE.glob("*.py")), FAKE_SGLANG_API, FAKE_SGLANG]
IDS = [p.name for p in HOST_FILES]
BUILTIN_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}
# Attributes and modules that Python 3.8 does not have (3.9 and later), as host code might use them.
NEWER_ATTRIBUTES = {
    "removeprefix", "removesuffix", "is_relative_to", "with_stem", "readlink_path", "bit_count", "file_digest",
    "unparse", "randbytes", "waitstatus_to_exitcode", "pairwise", "batched", "stdlib_module_names",
    "platlibdir", "orig_argv", "process_cpu_count", "packages_distributions", "to_thread", "TaskGroup",
    "ExceptionGroup", "UTC", "NoneType", "EllipsisType", "TypeAlias", "ParamSpec", "Self",
}
NEWER_MODULES = {"zoneinfo", "graphlib", "tomllib"}
NEWER_KEYWORDS = {("zip", "strict"), ("dataclass", "slots"), ("dataclass", "kw_only")}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path), feature_version=(3, 8))


@pytest.mark.parametrize("path", HOST_FILES, ids=IDS)
def test_parses_with_the_python38_grammar(path: Path) -> None:
    _tree(path)


def newer_than_python38(tree: ast.Module, name: str) -> list[str]:
    """Where `tree` uses what Python 3.8 lacks: names, modules, keywords, run-time generics and unions."""
    lazy = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations"
               for a in n.names) for n in tree.body)
    annotations: set[int] = set()  # strings under `from __future__ import annotations`
    unevaluated: set[int] = set()  # under `if TYPE_CHECKING:`
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            unevaluated.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
        anns = [getattr(node, "returns", None), getattr(node, "annotation", None)]
        for ann in filter(None, anns):
            annotations.update(id(sub) for sub in ast.walk(ann))
    found = []
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and (node.attr in NEWER_ATTRIBUTES or (
                node.attr == "cache" and getattr(node.value, "id", "") == "functools")):
            found.append(f"{where} .{node.attr}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{where} import {n}" for n in names if n.split(".")[0] in NEWER_MODULES]
            if isinstance(node, ast.ImportFrom) and node.module == "functools":
                found += [f"{where} functools.cache" for a in node.names if a.name == "cache"]
        elif isinstance(node, ast.Call):
            func = getattr(node.func, "id", getattr(node.func, "attr", ""))
            found += [f"{where} {func}({k.arg}=)" for k in node.keywords if (func, k.arg) in NEWER_KEYWORDS]
        if id(node) in unevaluated or (lazy and id(node) in annotations):
            continue
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") in BUILTIN_GENERICS:
            found.append(f"{where} {getattr(node.value, 'id', '')}[...] evaluated at run time")
        if id(node) in annotations and isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            found.append(f"{where} X | Y annotation evaluated at run time")
    return found


@pytest.mark.parametrize("path", HOST_FILES, ids=IDS)
def test_uses_nothing_newer_than_python38(path: Path) -> None:
    found = newer_than_python38(_tree(path), path.name)
    assert not found, found


def test_the_checker_finds_what_python38_lacks() -> None:
    """The check above cannot pass by accident: each kind it looks for, planted, is found."""
    sample = (
        "import zoneinfo\nfrom functools import cache\nimport functools\n"
        "def f(a: list[int]) -> int | None:\n    return 'x'.removeprefix('y')\n"
        "X = dict[str, int]\nzip([], [], strict=True)\nfunctools.cache\n"
        "if TYPE_CHECKING:\n    Y = tuple[int, str]\n"
    )
    found = newer_than_python38(ast.parse(sample, feature_version=(3, 8)), "s.py")
    assert sorted(found) == sorted([
        "s.py:1 import zoneinfo", "s.py:2 functools.cache", "s.py:4 list[...] evaluated at run time",
        "s.py:4 X | Y annotation evaluated at run time", "s.py:5 .removeprefix",
        "s.py:6 dict[...] evaluated at run time", "s.py:7 zip(strict=)", "s.py:8 .cache"])
    lazy = newer_than_python38(ast.parse("from __future__ import annotations\ndef f(a: list[int]) -> int | None:"
                                         "\n    pass\n"), "s.py")
    assert lazy == []


def test_ruff_with_a_python38_target() -> None:
    """The same files through ruff's py38 syntax checks and FA102 (the Makefile's lint runs it too)."""
    ruff = Path(sys.executable).parent / "ruff"
    proc = subprocess.run([str(ruff), "check", "--isolated", "--target-version", "py38", "--select", "E9,FA,PLE",
                           "--output-format", "concise", *map(str, HOST_FILES)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# Each module as it is shipped (includes inlined), compiled and its top level run under another name.
RUN_EVERY = """\
import json, sys, types
done = []
for name, text in json.loads(sys.stdin.read()):
    module = types.ModuleType(name[:-3])  # registered: the stand-in imports its answers by that name
    exec(compile(text, name, "exec"), module.__dict__)
    sys.modules[name[:-3]] = module
    done.append(name)
print(json.dumps({"version": list(sys.version_info[:2]), "done": done}))
"""
VERSIONS = ["3.8", "3.9", "3.10", "3.12", "3.13"]
PYTHONS = [pytest.param("/usr/bin/python3", id="system-python3")] + [
    pytest.param(find_python(v), id=f"python{v}",
                 marks=pytest.mark.skipif(find_python(v) is None, reason=NO_PY38)) for v in VERSIONS[:1]
] + [pytest.param(find_python(v), id=f"python{v}") for v in VERSIONS[1:] if find_python(v)]


@pytest.mark.parametrize("python", PYTHONS)
def test_host_modules_load_on_every_interpreter_here(python: str) -> None:
    texts = [(p.name, module_source(p.stem)[0]) for p in HOST_FILES[:-2]]
    texts += [(p.name, p.read_text(encoding="utf-8")) for p in (FAKE_SGLANG_API, FAKE_SGLANG)]
    proc = subprocess.run([python, "-c", RUN_EVERY], input=json.dumps(texts), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["done"] == IDS
