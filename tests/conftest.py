"""Shared fixtures. Lab fixtures start real sshd hosts (root only; skipped otherwise)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import skip_guard
from lab_support import (
    SCRATCH_LAB_BASE,
    SCRATCH_LAB_DIR,
    SCRATCH_LAB_HOSTS,
    SESSION_LAB_BASE,
    SESSION_LAB_DIR,
    SESSION_LAB_HOSTS,
    LabHandle,
    lab_usable,
    private_lab,
    shared_lab,
)
from service_cleanup import clean_releases


def pytest_addoption(parser: pytest.Parser) -> None:
    skip_guard.pytest_addoption(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Unexpected skips and deselections fail the run; so does a whole-suite run without the lab."""
    skip_guard.pytest_configure(config)
    # A suite started in the background by a shell without job control (`make test &` in a script,
    # nohup) inherits SIGINT ignored, and so would every fleetctl it starts: the Ctrl-C tests would
    # then wait for an interrupt that never lands. A terminal never ignores it; neither do the tests.
    # A handler (not SIG_IGN) is reset to the default in the children exec'd from here.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# `make pytest` runs two pytest-xdist workers, each taking whole modules (--dist loadfile) in this
# order: the longest modules first, so both workers end at about the same time. Order within a
# module is kept.
LONGEST_FIRST = (
    "test_e2e_full_env.py", "test_e2e_rollout_serving.py", "test_e2e_ansible_playbook.py", "test_e2e_playbook.py",
    "test_e2e_release.py", "test_reliability_tarpit.py", "test_e2e_gateway.py",
    "test_reliability_release.py", "test_e2e_become.py", "test_e2e_nonroot.py", "test_e2e_kernels.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# The machine's own ~/.ssh/config must not steer the tests; those about ssh_config write their own.
os.environ["FLEETCTL_SSH_CONFIG"] = "none"
# Nor a fleetctl.cfg/ansible.cfg in the developer's folder or home (test_cli_config.py writes its own).
os.environ["FLEETCTL_CONFIG"] = "none"


@pytest.fixture(scope="session")
def lab_fleet() -> Iterator[LabHandle]:
    """A 3-host lab (lab1..lab3 on 127.N.77.x, N per checkout) for the whole session; keep it pristine.

    Stale state from a killed run is recovered by lab_up; hosts stopped or rekeyed through the
    handle are restored after each test (see `_restore_lab_fleet`) and at session end.
    """
    why = lab_usable()
    if why:
        pytest.skip(why)
    with shared_lab(SESSION_LAB_DIR, SESSION_LAB_HOSTS, SESSION_LAB_BASE) as handle:
        yield handle


@pytest.fixture(autouse=True)
def _no_secrets_from_an_earlier_test() -> None:
    """The redaction registry is per process: one test's secrets never mask another's output."""
    from fleetctl import redact

    redact.REGISTRY.clear()


@pytest.fixture(autouse=True)
def _restore_lab_fleet(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, bring back any session-lab host it stopped or rekeyed."""
    yield
    if "lab_fleet" in request.fixturenames:
        handle: LabHandle = request.getfixturevalue("lab_fleet")
        handle.restore()


@pytest.fixture
def scratch_lab() -> Iterator[LabHandle]:
    """A fresh 2-host lab (127.N.78.x) owned by one test, for stop/rekey/kill; purged after."""
    why = lab_usable()
    if why:
        pytest.skip(why)
    with private_lab(SCRATCH_LAB_DIR, SCRATCH_LAB_HOSTS, SCRATCH_LAB_BASE) as handle:
        yield handle


@pytest.fixture(scope="session")
def sglang_lab(lab_fleet: LabHandle) -> LabHandle:
    """The session lab with real sglang venvs at /root/ml-env: lab1, lab3 0.5.23; lab2 0.5.9."""
    from sglang_support import LAYOUT, install_layout

    install_layout(lab_fleet, LAYOUT)
    return lab_fleet


# Stops the release's servers and their supervisors (by their pidfiles) and removes every release,
# its state and the supervisor's boot entries on a host.
CLEAN_RELEASES = clean_releases()


@pytest.fixture(scope="module")
def release_free_lab(sglang_lab: LabHandle) -> Iterator[LabHandle]:
    """The sglang lab with no release on any host at the start and at the end; services stopped."""
    for host in sglang_lab.hosts:
        sglang_lab.ssh(host, CLEAN_RELEASES)
    yield sglang_lab
    for host in sglang_lab.hosts:
        sglang_lab.ssh(host, CLEAN_RELEASES)


@pytest.fixture
def mux_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private connection server (``--persist``) for this test, stopped with every kept connection at
    the end. A short folder: a unix socket's path has at most 107 bytes, which a long test's tmp_path
    under xdist overruns."""
    from fleetctl.transport import mux

    folder = Path(tempfile.mkdtemp(prefix="fx-mux-")) / "mux"
    monkeypatch.setenv("FLEETCTL_MUX_DIR", str(folder))
    yield folder
    mux.stop_server(mux.socket_path(folder))
    shutil.rmtree(folder.parent, ignore_errors=True)
