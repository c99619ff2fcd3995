"""The skip guard (tests/skip_guard.py) itself: a run that skipped, deselected or lost the lab fails.

Each case runs pytest in a child process; the last two run a real lab test of this suite with the
lab check pointed at a missing unshare (the run must fail) and with the lab as it is (it must pass).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from lab_support import LabHandle

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
CONFTEST = """\
import skip_guard

skip_guard.ALLOWED_SKIPS.clear()
skip_guard.ALLOWED_SKIPS["test_inner.py::test_allowed"] = ("no widget here", "widgets are rare")
skip_guard.ALLOWED_XFAILS.clear()
skip_guard.ALLOWED_XFAILS["test_known.py::*"] = "a known upstream bug"


def pytest_addoption(parser):
    skip_guard.pytest_addoption(parser)


def pytest_configure(config):
    skip_guard.pytest_configure(config)
"""
INNER = """\
import pytest


def test_plain():
    pass


def test_allowed():
    pytest.skip("no widget here today")


@pytest.mark.lab
def test_in_the_lab():
    pass
"""


def _pytest(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    child_env = {**os.environ, "PYTHONPATH": str(TESTS), **(env or {})}
    child_env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=cwd, env=child_env, capture_output=True, text=True, timeout=600)


@dataclass
class Inner:
    path: Path
    workers: tuple[str, ...]  # () or ("-n", "2"): `make pytest` runs under pytest-xdist

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _pytest(self.path, *self.workers, *args)


@pytest.fixture(params=[(), ("-n", "2")], ids=["one-process", "xdist"])
def inner(tmp_path: Path, request: pytest.FixtureRequest) -> Inner:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    lab: lab\n")
    return Inner(tmp_path, request.param)


def test_allowed_skip_passes_and_says_why(inner: Inner) -> None:
    r = inner.run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "test_inner.py::test_allowed: no widget here today" in r.stdout
    assert "allowed because: widgets are rare" in r.stdout


def test_unexpected_skip_fails_the_run(inner: Inner) -> None:
    (inner.path / "test_more.py").write_text("import pytest\n\ndef test_gone():\n    pytest.skip('gcc missing')\n")
    r = inner.run()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "test_more.py::test_gone skipped: gcc missing (not on tests/skip_allowlist.py)" in r.stdout
    assert "2 passed, 2 skipped" in r.stdout  # pytest alone would exit 0 here


def test_unexpected_skipif_and_module_skip_fail_the_run(inner: Inner) -> None:
    (inner.path / "test_more.py").write_text("import pytest\n\n@pytest.mark.skipif(True, reason='no 3.8')\n"
                                        "def test_old():\n    pass\n")
    (inner.path / "test_mod.py").write_text("import pytest\npytest.importorskip('no_such_module_here')\n")
    r = inner.run()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "test_more.py::test_old skipped: no 3.8" in r.stdout
    assert "test_mod.py skipped: could not import 'no_such_module_here'" in r.stdout


def test_deselection_fails_a_whole_suite_run_only(inner: Inner) -> None:
    assert inner.run("-k", "not plain").returncode == 0  # a targeted run may narrow itself
    r = inner.run("--whole-suite", "-k", "not plain")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "test_inner.py::test_plain deselected" in r.stdout


def test_whole_suite_needs_every_lab_test_collected_to_pass(inner: Inner) -> None:
    ok = inner.run("--whole-suite")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "lab tests passed: 1 of 1 collected" in ok.stdout
    # a lab test that fails with -x: it and whatever -x left unrun are lab tests collected that did not pass
    (inner.path / "test_more.py").write_text("import pytest\n\n@pytest.mark.lab\ndef test_a():\n    assert 0\n\n"
                                             "@pytest.mark.lab\ndef test_b():\n    pass\n")
    short = inner.run("--whole-suite", "-x")
    assert short.returncode in (1, 2), short.stdout  # 2: xdist reports -x as an interruption
    assert "of 3 lab tests collected passed (every one must)" in short.stdout, short.stdout


@pytest.mark.parametrize("narrowing", [("--ignore", "test_more.py"), ("--ignore-glob", "*more*"), ("test_inner.py",),
                                       ("--deselect", "test_more.py::test_lab2")])
def test_whole_suite_refuses_files_left_out(inner: Inner, narrowing: tuple[str, ...]) -> None:
    """--ignore is not a deselection to pytest: the guard counts test files on disk against those collected."""
    (inner.path / "test_more.py").write_text("import pytest\n\n@pytest.mark.lab\ndef test_lab2():\n    pass\n")
    assert inner.run("--whole-suite").returncode == 0
    r = inner.run("--whole-suite", *narrowing)
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("test_more.py not collected" in r.stdout or "test_more.py::test_lab2 deselected" in r.stdout), r.stdout
    assert inner.run(*narrowing).returncode == 0  # a targeted run may


def test_xfail_fails_the_run_unless_allowed(inner: Inner) -> None:
    (inner.path / "test_more.py").write_text(
        "import pytest\n\n@pytest.mark.xfail(reason='flaky')\ndef test_x():\n    assert 0\n\n"
        "@pytest.mark.xfail(reason='fixed?')\ndef test_xpass():\n    pass\n\n"
        "def test_call():\n    pytest.xfail('later')\n")
    (inner.path / "test_known.py").write_text("import pytest\n\n@pytest.mark.xfail(reason='bug 1')\n"
                                              "def test_bug():\n    assert 0\n")
    r = inner.run()
    assert r.returncode == 1, r.stdout + r.stderr
    for nodeid, reason in [("test_x", "flaky"), ("test_xpass", "fixed?"), ("test_call", "later")]:
        assert f"test_more.py::{nodeid} xfail: {reason} (not on tests/skip_allowlist.py" in r.stdout, r.stdout
    assert "test_known.py::test_bug" not in r.stdout.split("skip guard: this run fails")[1]


def test_the_guard_cannot_be_switched_off(inner: Inner) -> None:
    r = inner.run("-p", "no:fleetctl-skip-guard")
    assert r.returncode == 4, r.stdout + r.stderr  # a usage error
    assert "the skip guard (tests/skip_guard.py) is disabled" in r.stderr


def test_make_pytest_fails_without_the_guards_verdict(tmp_path: Path) -> None:
    """`make pytest` passes only when the guard wrote "ok": a run where the guard never ran (its
    conftest bypassed, say) writes nothing, and the Makefile's own check fails it."""
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\npytest:", 1)[1].split("\n\n", 1)[0]
    assert "--guard-verdict $(GUARD_VERDICT)" in recipe and "rm -f $(GUARD_VERDICT)" in recipe
    check = recipe.split("@grep", 1)[1].replace("$(GUARD_VERDICT)", str(tmp_path / "v")).replace("\\\n", "")
    (tmp_path / "v").write_text("skip guard: ok\n")
    assert subprocess.run("grep" + check, shell=True).returncode == 0
    for verdict in ("skip guard: failed\n", None):
        (tmp_path / "v").unlink(missing_ok=True)
        if verdict:
            (tmp_path / "v").write_text(verdict)
        assert subprocess.run("grep" + check, shell=True, capture_output=True).returncode == 1


def test_the_guard_writes_its_verdict(inner: Inner) -> None:
    verdict = inner.path / "verdict"
    assert inner.run("--whole-suite", "--guard-verdict", str(verdict)).returncode == 0
    assert verdict.read_text() == "skip guard: ok\n"
    assert inner.run("--whole-suite", "--guard-verdict", str(verdict), "-k", "not plain").returncode == 1
    assert verdict.read_text() == "skip guard: failed\n"


def test_lab_fixture_without_the_lab_marker_fails(inner: Inner) -> None:
    (inner.path / "test_more.py").write_text("import pytest\n\n@pytest.fixture\ndef lab_fleet():\n    return 1\n\n"
                                        "def test_sneaky(lab_fleet):\n    pass\n")
    r = inner.run()
    assert r.returncode == 1
    assert "test_more.py::test_sneaky uses the lab but is not marked `lab`" in r.stdout


LAB_TEST = "tests/test_lab.py::test_each_host_answers_with_its_own_hostname"


@pytest.mark.lab
def test_a_broken_lab_fails_the_real_suite(lab_fleet: LabHandle) -> None:
    """The real conftest and a real lab test: unshare missing -> the run fails and says why."""
    broken = _pytest(REPO, LAB_TEST, env={"FLEETCTL_TEST_UNSHARE": "/nonexistent/unshare"})
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "1 skipped" in broken.stdout  # pytest alone would have called this run green
    assert f"{LAB_TEST} skipped: the lab needs /nonexistent/unshare (util-linux)" in broken.stdout
    # the control: the same run with the lab as it is passes (it joins the session's running lab)
    working = _pytest(REPO, LAB_TEST)
    assert working.returncode == 0, working.stdout + working.stderr
