"""The docs a newcomer reads: the README short and pointing at every guide, the site built strictly
(a broken link or a page left out of the nav fails), and the generated references current with the
code: every command and option, every release-spec key, every host variable fleetctl reads."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from fleetctl.gpu.health import Thresholds
from fleetctl.inventory.host_vars import HOST_VARS, documented_names
from fleetctl.release.spec import ReleaseModel

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fleetctl"


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_references_are_current() -> None:
    diffs = _gen_docs().stale()
    assert not diffs, "docs/reference/ is not current: run scripts/gen_docs.py\n" + "\n".join(diffs)


def test_every_release_spec_key_has_a_meaning() -> None:
    rows = list(_gen_docs().spec_rows(ReleaseModel))
    keys = [key for key, *_ in rows]
    for key in ("service.manager", "service.stop_timeout", "health.interval", "service.instances[].port",
                "health.probes[].import", "base.adopt"):
        assert key in keys
    assert [key for key, _, _, meaning in rows if not meaning.strip()] == []


# Reads of a host variable, as the package writes them: X.vars.get("k"), host_vars["k"], the
# connection parser's _text(v, "k"), and module constants NAME_VAR = "k" / NAME_VARS = (...).
_VARS_RECEIVER = re.compile(r"((?<!^context)\.vars|^(host_vars|hostvars|variables|first_vars|v|lazy))$")
_CONN_HELPERS = {"_text", "_path", "_first", "_flag", "_port"}


def _reads(tree: ast.AST, connection_parser: bool) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
            if isinstance(func, ast.Attribute) and func.attr == "get" and _VARS_RECEIVER.search(receiver):
                found |= _strings(node.args[:1])
            if connection_parser and isinstance(func, ast.Name) and func.id in _CONN_HELPERS:
                found |= _strings(node.args[1:])
        loaded = isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
        if loaded and isinstance(node, ast.Subscript) and _VARS_RECEIVER.search(ast.unparse(node.value)):
            found |= _strings([node.slice])
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and re.search(r"(?<!ENV)_VARS?$", t.id)
                                                for t in node.targets):
            found |= {s for s in _strings(list(ast.walk(node.value))) if "_" in s or s.isidentifier()}
    return found


def _strings(nodes: list[ast.AST]) -> set[str]:
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_every_host_variable_fleetctl_reads_is_documented() -> None:
    read: dict[str, str] = {}
    for path in PACKAGE.rglob("*.py"):
        if {"remote", "lab"} & set(path.relative_to(PACKAGE).parts):
            continue  # host-side code and the lab harness read no inventory
        for name in _reads(ast.parse(path.read_text(), str(path)), path.name == "connection.py"):
            read.setdefault(name, str(path.relative_to(ROOT)))
    gpu = {"gpus_expected", "gpu_model", *(f"gpu_{f}" for f in Thresholds.__dataclass_fields__
                                          if f not in ("gpus_expected", "gpu_model"))}
    assert {"ansible_host", "fleetctl_state_dir", "service_manager", "dist_init_port", "direct_ssh_key"} <= set(read)
    undocumented = {n: where for n, where in read.items() if n not in documented_names()}
    undocumented |= {n: "fleetctl/gpu/health.py" for n in gpu - documented_names()}
    assert undocumented == {}, "add them to fleetctl/inventory/host_vars.py, then run scripts/gen_docs.py"
    assert len({v.name for v in HOST_VARS}) == len(HOST_VARS)


def test_readme_is_short_and_reaches_every_guide() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    assert "pipx install" in readme and "make demo" in readme and "make test" in readme
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert [t for t in local if not (ROOT / t).exists()] == []
    guides = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "guides").glob("*.md"))
    assert [g for g in guides if g not in local] == []


def test_product_text_names_no_issue_numbers() -> None:
    texts = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.j2")]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in texts
             for m in re.finditer(r"issue[ -]?[0-9]+", p.read_text(), re.IGNORECASE)]
    assert found == []


def _build_site(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([str(mkdocs), "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=280, check=False)


@pytest.mark.timeout(300)
def test_docs_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = _build_site(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


@pytest.mark.timeout(300)
def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path) -> None:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "docs" / "guides" / "left-out.md").write_text("# Not in the nav\n")
    with (tmp_path / "docs" / "guides" / "drift.md").open("a") as page:
        page.write("\n[gone](deploy.md#no-such-section)\n")
    done = _build_site(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert "guides/left-out.md" in done.stderr and "no-such-section" in done.stderr, done.stderr
