"""A gate failure under systemd shows the unit's last journal lines, as it does under the
supervisor. No systemd runs as PID 1 here, so ``systemctl`` and ``journalctl`` are stand-ins on
PATH that answer as they do for a unit that failed to start (``is-active``: ``failed``, exit 3;
the journal: the lines in tests/fixtures/journal/, in ``-o cat`` form); the host side runs for real
in a local agent, and the gate reads its answer."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl.release.gates import wait_healthy
from fleetctl.release.service import control, layout_for
from fleetctl.release.spec import Health
from fleetctl.transport.agent import AgentClient
from fleetctl.transport.local import LocalConnector

JOURNAL = Path(__file__).resolve().parent / "fixtures" / "journal" / "sglang-tp4-b-failed.txt"


def tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


class LocalSession:
    """A host session over a local agent (real processes, no SSH): what gates are given."""

    def __init__(self, agent: AgentClient, host_vars: dict[str, Any]) -> None:
        self.name, self.vars, self.agent = "local", host_vars, agent

    def call(self, op: str, params: dict[str, Any] | None = None, *, python: str | None = None,
             timeout: float | None = None) -> Any:
        return self.agent.call(op, params, python=python, timeout=timeout or 60)

    def run(self, command: str, timeout: float | None = None) -> Any:
        raise NotImplementedError


@pytest.fixture
def failed_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalSession]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Each records how it was called, so the test sees the journal was asked for this unit.
    tool(bin_dir, "systemctl", f'echo "systemctl $*" >> {tmp_path}/calls; echo failed; exit 3')
    tool(bin_dir, "journalctl", f'echo "journalctl $*" >> {tmp_path}/calls; cat {JOURNAL}')
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    agent = AgentClient("local", LocalConnector("local"), ["/usr/bin/python3"])
    yield LocalSession(agent, {"service_manager": "systemd", "fleetctl_root": str(tmp_path / "opt"),
                               "fleetctl_state_dir": str(tmp_path / "state")})
    agent.close()


def test_a_failed_units_status_carries_its_journal_and_the_gate_shows_it(failed_unit: LocalSession,
                                                                           tmp_path: Path) -> None:
    layout = layout_for(failed_unit.vars)
    status = failed_unit.call("service_host", control(layout, "status", "tp4-b"))
    assert (status["manager"], status["running"], status["state"]) == ("systemd", False, "failed")
    assert status["log_tail"] == JOURNAL.read_text().splitlines()
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "journalctl -u sglang@tp4-b.service -n 15 --no-pager -o cat" in calls

    gate = wait_healthy(failed_unit, Health(timeout=5, interval=0.1), layout, 1, "tp4-b")
    assert not gate.ok
    assert gate.detail.startswith("the service exited (")
    assert gate.detail.endswith("; log: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                                "GPU 0 has a total capacity of 139.81 GiB of which 1.12 GiB is free. | "
                                "sglang@tp4-b.service: Main process exited, code=exited, status=1/FAILURE | "
                                "sglang@tp4-b.service: Failed with result 'exit-code'.")
