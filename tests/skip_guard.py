"""A pytest plugin: a run with unexpected skips, deselections or lab tests that did not run fails.

- Every skip (test or collection) must match tests/skip_allowlist.py; the allowed ones are listed
  with their reasons at the end of the run, the others fail it (exit status 1).
- Every test that uses a lab fixture must carry the `lab` marker (so the count below means something).
- An xfail (mark or call) that is not on tests/skip_allowlist.py's ALLOWED_XFAILS fails the run.
- With --whole-suite (what `make test` passes): any deselected test fails the run; so does a test
  file under ``testpaths`` that was not collected (``--ignore``, ``collect_ignore``, a path
  argument), and every lab test collected must have passed (or be an allowed skip): the message
  says how many did not, and why the lab could not run (lab_support.lab_usable).
- With --guard-verdict PATH the guard writes its verdict there at the end; `make pytest` removes
  the file first and fails unless it says ``ok``, so a run with the guard disabled
  (``-p no:fleetctl-skip-guard``) cannot pass.
Registered by tests/conftest.py.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from skip_allowlist import ALLOWED_SKIPS, ALLOWED_XFAILS

LAB_FIXTURES = {"lab_fleet", "scratch_lab", "rollout_lab", "release_free_lab"}
VERDICT_OK = "skip guard: ok"


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason.removeprefix("Skipped: ")
    return str(longrepr)


def allowed(nodeid: str, reason: str) -> str | None:
    """Why this skip is legitimate, or None when it is not on the allow-list."""
    for pattern, (expected, why) in ALLOWED_SKIPS.items():
        if fnmatch.fnmatchcase(nodeid, pattern) and reason.startswith(expected):
            return why
    return None


def not_collected(config: pytest.Config, collected: set[str]) -> list[str]:
    """Test files under ``testpaths`` (else the root folder) that produced no collection report."""
    root = Path(str(config.rootpath))
    patterns = config.getini("python_files")
    files = {str(path.relative_to(root)) for top in (config.getini("testpaths") or ["."])
             for path in (root / top).rglob("*.py")
             if any(fnmatch.fnmatch(path.name, pat) for pat in patterns) and ".venv" not in path.parts}
    return sorted(files - collected)


@dataclass(eq=False)
class SkipGuard:
    whole_suite: bool
    verdict_file: str | None = None
    lab_items: set[str] = field(default_factory=set)
    lab_ran: set[str] = field(default_factory=set)  # lab tests that passed or were allowed to skip
    collected_files: set[str] = field(default_factory=set)
    allowed_skips: list[tuple[str, str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    role: str = "single"  # "worker" or "controller" under pytest-xdist
    lab_total: int = 0

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if item.get_closest_marker("lab"):
                self.lab_items.add(item.nodeid)
            elif LAB_FIXTURES & set(getattr(item, "fixturenames", ())):
                self.problems.append(f"{item.nodeid} uses the lab but is not marked `lab`")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.whole_suite and self.role != "controller":  # xdist: the workers collect
            for path in not_collected(session.config, self.collected_files):
                self.problems.append(f"{path} not collected (--ignore, collect_ignore or a path argument; "
                                     "a run of the whole suite collects every test file)")

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        if self.whole_suite:
            for item in items:
                self.problems.append(f"{item.nodeid} deselected (a run of the whole suite deselects nothing)")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self.collected_files.add(report.nodeid.split("::")[0])
        if report.skipped:
            self._skipped(report.nodeid, _skip_reason(report))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.role == "worker":  # the controller of the workers sees this report too and counts it
            return
        lab = report.nodeid in self.lab_items or "lab" in report.keywords
        if hasattr(report, "wasxfail"):  # xfailed (reported as skipped) or xpassed
            if not any(fnmatch.fnmatchcase(report.nodeid, pattern) for pattern in ALLOWED_XFAILS):
                self.problems.append(f"{report.nodeid} xfail: {report.wasxfail or 'no reason'} (not on "
                                     "tests/skip_allowlist.py ALLOWED_XFAILS)")
        elif report.skipped:
            if self._skipped(report.nodeid, _skip_reason(report)) and lab:
                self.lab_ran.add(report.nodeid)
        elif report.when == "call" and report.passed and lab:
            self.lab_ran.add(report.nodeid)

    # Under pytest-xdist, collection (lab items, deselections, collection skips) happens in the
    # workers and test reports reach the controller: each worker hands its findings over when it ends.
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        found = getattr(node, "workeroutput", {}).get("skip_guard")
        if found is None:
            return
        self.lab_total = max(self.lab_total, found["lab_items"])  # every worker collects every test
        for problem in found["problems"]:
            if problem not in self.problems:
                self.problems.append(problem)
        for skip in found["allowed"]:
            if tuple(skip) not in self.allowed_skips:
                self.allowed_skips.append(tuple(skip))

    def _skipped(self, nodeid: str, reason: str) -> bool:
        why = allowed(nodeid, reason)
        if why is None:
            self.problems.append(f"{nodeid} skipped: {reason} (not on tests/skip_allowlist.py)")
            return False
        self.allowed_skips.append((nodeid, reason, why))
        return True

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.role == "worker":
            workeroutput = session.config.workeroutput  # type: ignore[attr-defined]
            workeroutput["skip_guard"] = {"problems": self.problems, "allowed": self.allowed_skips,
                                          "lab_items": len(self.lab_items)}
            return
        self.lab_total = max(self.lab_total, len(self.lab_items))
        if self.whole_suite and len(self.lab_ran) < self.lab_total:
            from lab_support import lab_usable

            why = lab_usable() or "the lab could be started; see the lab tests' own failures"
            self.problems.append(f"only {len(self.lab_ran)} of {self.lab_total} lab tests collected passed "
                                 f"(every one must): {why}")
        if self.problems and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.verdict_file:
            ok = not self.problems and session.exitstatus == pytest.ExitCode.OK
            Path(self.verdict_file).write_text((VERDICT_OK if ok else "skip guard: failed") + "\n")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tr = terminalreporter
        if self.allowed_skips:
            tr.section("allowed skips (tests/skip_allowlist.py)")
            for nodeid, reason, why in self.allowed_skips:
                tr.line(f"{nodeid}: {reason}\n    allowed because: {why}")
        if self.whole_suite:
            tr.line(f"lab tests passed: {len(self.lab_ran)} of {self.lab_total} collected")
        if self.problems:
            tr.section("skip guard: this run fails", red=True, bold=True)
            for problem in self.problems:
                tr.line(problem, red=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fleetctl")
    group.addoption("--whole-suite", action="store_true",
                    help="this run is the whole suite: fail on any deselection or test file not collected, "
                         "and unless every lab test collected passed")
    group.addoption("--guard-verdict", metavar="PATH",
                    help="write the guard's verdict here (`make pytest` fails unless it says ok)")


def pytest_configure(config: pytest.Config) -> None:
    role = ("worker" if hasattr(config, "workerinput")
            else "controller" if getattr(config.option, "numprocesses", None) else "single")
    guard = SkipGuard(config.getoption("--whole-suite"), config.getoption("--guard-verdict"), role=role)
    if config.pluginmanager.register(guard, "fleetctl-skip-guard") is None:  # -p no:fleetctl-skip-guard
        raise pytest.UsageError("the skip guard (tests/skip_guard.py) is disabled: this suite does not run "
                                "without it")
