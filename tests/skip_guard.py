"""A pytest plugin: a run with unexpected skips, deselections or lab tests that did not run fails.

- Every skip (test or collection) must match tests/skip_allowlist.py; the allowed ones are listed
  with their reasons at the end of the run, the others fail it (exit status 1).
- Every test that uses a lab fixture must carry the `lab` marker (so the count below means something).
- With --whole-suite (what `make test` passes): any deselected test fails the run, and so does a run
  in which fewer than --min-lab-passed tests marked `lab` passed; the message says why the lab could
  not run (lab_support.lab_usable), e.g. not root or no unshare.
Registered by tests/conftest.py.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

import pytest
from skip_allowlist import ALLOWED_SKIPS

LAB_FIXTURES = {"lab_fleet", "scratch_lab", "rollout_lab"}
# 153 tests are marked `lab` today; a run of the whole suite must see most of them pass.
MIN_LAB_PASSED = 140


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


@dataclass(eq=False)
class SkipGuard:
    whole_suite: bool
    min_lab_passed: int
    lab_items: set[str] = field(default_factory=set)
    lab_passed: int = 0
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

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        if self.whole_suite:
            for item in items:
                self.problems.append(f"{item.nodeid} deselected (a run of the whole suite deselects nothing)")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self._skipped(report.nodeid, _skip_reason(report))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.role == "worker":  # the controller of the workers sees this report too and counts it
            return
        if report.skipped and not hasattr(report, "wasxfail"):
            self._skipped(report.nodeid, _skip_reason(report))
        elif report.when == "call" and report.passed and (report.nodeid in self.lab_items or "lab" in report.keywords):
            self.lab_passed += 1

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

    def _skipped(self, nodeid: str, reason: str) -> None:
        why = allowed(nodeid, reason)
        if why is None:
            self.problems.append(f"{nodeid} skipped: {reason} (not on tests/skip_allowlist.py)")
        else:
            self.allowed_skips.append((nodeid, reason, why))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.role == "worker":
            workeroutput = session.config.workeroutput  # type: ignore[attr-defined]
            workeroutput["skip_guard"] = {"problems": self.problems, "allowed": self.allowed_skips,
                                          "lab_items": len(self.lab_items)}
            return
        self.lab_total = max(self.lab_total, len(self.lab_items))
        if self.whole_suite and self.lab_passed < self.min_lab_passed:
            from lab_support import lab_usable

            why = lab_usable() or "the lab could be started; see the lab tests' own failures"
            self.problems.append(f"only {self.lab_passed} of {self.lab_total} lab tests passed "
                                 f"(at least {self.min_lab_passed} must): {why}")
        if self.problems and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tr = terminalreporter
        if self.allowed_skips:
            tr.section("allowed skips (tests/skip_allowlist.py)")
            for nodeid, reason, why in self.allowed_skips:
                tr.line(f"{nodeid}: {reason}\n    allowed because: {why}")
        if self.whole_suite:
            tr.line(f"lab tests passed: {self.lab_passed} of {self.lab_total} (at least {self.min_lab_passed})")
        if self.problems:
            tr.section("skip guard: this run fails", red=True, bold=True)
            for problem in self.problems:
                tr.line(problem, red=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fleetctl")
    group.addoption("--whole-suite", action="store_true",
                    help="this run is the whole suite: fail on any deselection and unless the lab tests ran")
    group.addoption("--min-lab-passed", type=int, default=MIN_LAB_PASSED,
                    help=f"with --whole-suite, how many `lab` tests must pass (default {MIN_LAB_PASSED})")


def pytest_configure(config: pytest.Config) -> None:
    role = ("worker" if hasattr(config, "workerinput")
            else "controller" if getattr(config.option, "numprocesses", None) else "single")
    guard = SkipGuard(config.getoption("--whole-suite"), config.getoption("--min-lab-passed"), role=role)
    config.pluginmanager.register(guard, "fleetctl-skip-guard")
