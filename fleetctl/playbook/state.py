"""What a playbook run is, as the modules around the runner see it: its options, one play's rollout as it
goes, and ``RunnerView``, the runner's face to ``approval``, ``capacity`` and ``releases`` (they take the
runner; naming it here keeps them from importing ``runner.py``, which imports them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from fleetctl.playbook.interact import Operator
from fleetctl.playbook.play_schema import Play, Playbook
from fleetctl.playbook.schema import Task
from fleetctl.runs import journal as journal_mod
from fleetctl.runs import rollout
from fleetctl.vault import Vault

if TYPE_CHECKING:
    from fleetctl.playbook.modules import RunServices
    from fleetctl.transport.fleet import Fleet, HostContext

T = TypeVar("T")


@dataclass
class RunOptions:
    check: bool = False
    diff: bool = False
    tags: frozenset[str] = frozenset()
    skip_tags: frozenset[str] = frozenset()
    start_at_task: str | None = None
    limit: str | None = None
    extra_vars: dict[str, Any] = field(default_factory=dict)
    resume_events: list[dict[str, Any]] | None = None  # the journal of the run being resumed
    rollback_timeout: float = 300.0
    command: str = "fleetctl run"
    vault: Vault | None = None  # --vault-password-file / --vault-id: encrypted copy sources
    operator: Operator = field(default_factory=Operator)  # the terminal (pause, --step), or none
    wait: float = 0.0  # --wait: seconds to wait for a host another run holds


class PlaybookStopped(Exception):
    """Internal: a budget was exceeded or the run was interrupted; no later batch or play runs."""


@dataclass
class Rollout:
    """One play's rollout as it goes: its batches, budgets, the hosts tried and failed so far."""

    play: Play
    plan: list[list[str]]
    recorded: dict[str, str | None]
    attempted: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def budget(self) -> rollout.Budget:
        m = self.play.model
        return rollout.Budget(m.max_fail_percentage, m.max_failures, m.any_errors_fatal)


class RunnerView(Protocol):
    """The runner's state and steps that the rollout's helpers use."""

    options: RunOptions
    journal: journal_mod.Journal
    playbook: Playbook
    fleet: Fleet
    services: RunServices
    holder: dict[str, Any]  # who runs it (hostlock.who)
    deadline: float | None
    failed_before: set[str]
    recap: dict[str, Counter[str]]
    results: dict[str, list[dict[str, Any]]]

    def stop(self) -> None: ...
    @property
    def stopping(self) -> bool: ...
    def wait(self, seconds: float) -> None: ...
    def emit(self, kind: str, **fields: Any) -> None: ...
    def halt(self, ro: Rollout, b: int, why: str, before_batch: bool = False) -> None: ...
    def forgive(self, host: str) -> None: ...
    def run_task_on(self, play: Play, b: int, batch: list[str], task: Task, hosts: list[str]) -> list[str]: ...
    def task_vars(self, ctx: HostContext, batch: list[str]) -> dict[str, Any]: ...
    def as_release(self, play: Play, fn: Callable[[HostContext], T]) -> Callable[[HostContext], T]: ...
