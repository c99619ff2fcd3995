"""A play as read and checked: its keywords (``PlayModel``: hosts, the rollout's ``serial`` steps and
budgets, ``on_failure``, ``approval``, Ansible's play structure), the parsed ``Play`` and the
``Playbook``. Tasks are ``schema.py``'s; ``plays.py`` builds a play's parts from its file."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetctl.playbook.schema import Task

OnFailure = Literal["halt", "rollback_failed", "rollback_all"]

_STEP = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def _check_step(step: int | str) -> int | str:
    if isinstance(step, bool):
        raise ValueError("a serial step is a host count or a percentage such as '25%'")
    if isinstance(step, int):
        if step < 1:
            raise ValueError(f"a serial step must be at least 1 host, got {step}")
        return step
    if step.strip().isdigit():
        return _check_step(int(step))
    m = _STEP.match(step)
    if not m or not 0 < float(m.group(1)) <= 100:
        raise ValueError(f"a serial step is a host count or a percentage in (0, 100], got {step!r}")
    return step.strip()


class Approval(BaseModel):
    model_config = ConfigDict(extra="forbid")

    before_batch: list[int] | Literal["each"] = [2]
    timeout: float = Field(default=3600.0, gt=0)
    on_timeout: Literal["abort", "promote"] = "abort"

    @field_validator("before_batch", mode="before")
    @classmethod
    def _batches(cls, value: Any) -> Any:
        if value == "each":
            return value
        items = value if isinstance(value, list) else [value]
        if not items or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in items):
            raise ValueError("before_batch is a batch number (1 is the canary), a list of them, or 'each'")
        return items

    def waits_before(self, batch: int) -> bool:
        return batch >= 2 if self.before_batch == "each" else batch in self.before_batch


class PlayModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = ""
    hosts: str
    tags: list[str] = Field(default_factory=list)  # every task of the play has them too
    vars: dict[str, Any] = Field(default_factory=dict)
    serial: list[int | str] | None = None  # a single step is read as a list of one
    # A host variable naming each host's multi-node group: batches never split a group.
    serial_group_var: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    max_fail_percentage: float | None = Field(default=None, ge=0, le=100)
    max_failures: int | None = Field(default=None, ge=0)
    any_errors_fatal: bool = False
    pause_between_batches: float = Field(default=0.0, ge=0)
    on_failure: OnFailure = "halt"
    become: bool | None = None  # Ansible's keyword: beats -b, loses to the inventory's ansible_become
    become_user: str | None = None
    # Soak and capacity (playbook/capacity.py): the health re-checked after each batch's pause, a floor
    # of hosts serving, a deadline for the whole play's rollout.
    recheck_after_pause: bool = True
    min_healthy: int | str | None = None
    progress_deadline: float | None = Field(default=None, gt=0)
    # Approval and rollback hooks (playbook/approval.py, playbook/releases.py).
    approval: Approval | None = None
    before_rollback: list[Any] = Field(default_factory=list)
    after_rollback: list[Any] = Field(default_factory=list)
    tasks: list[Any] = Field(default_factory=list)
    # Ansible's play structure (playbook/plays.py): facts first, vars files, roles, handlers.
    gather_facts: bool = False  # fleetctl's default: facts are opt-in (they cost a round of probes)
    vars_files: list[str] = Field(default_factory=list)
    pre_tasks: list[Any] = Field(default_factory=list)
    roles: list[Any] = Field(default_factory=list)
    post_tasks: list[Any] = Field(default_factory=list)
    handlers: list[Any] = Field(default_factory=list)

    @field_validator("tags", mode="before")
    @classmethod
    def _one_tag(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("vars_files", mode="before")
    @classmethod
    def _one_file(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("min_healthy", mode="before")
    @classmethod
    def _floor(cls, value: Any) -> Any:
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        if isinstance(value, str) and _STEP.match(value):
            return value.strip()
        raise ValueError("min_healthy is a host count (>= 0) or a percentage such as '75%'")

    @field_validator("serial", mode="before")
    @classmethod
    def _steps(cls, value: Any) -> Any:
        if value is None:
            return None
        steps = value if isinstance(value, list) else [value]
        if not steps:
            raise ValueError("serial: give at least one step")
        return [_check_step(s) for s in steps]


@dataclass
class Play:
    index: int
    model: PlayModel
    tasks: list[Task]  # every task, those inside blocks included, in order
    line: int
    body: list[Any] = field(default_factory=list)  # Task | blocks.Block | handlers.Flush, as run
    handlers: list[Task] = field(default_factory=list)  # in definition order (roles' first)
    defaults: dict[str, Any] = field(default_factory=dict)  # roles' defaults: below the inventory
    more_vars: dict[str, Any] = field(default_factory=dict)  # vars_files, then roles' vars: above play vars
    source: Path | None = None
    rollback_hooks: dict[str, list[Any]] = field(default_factory=dict)  # before_rollback / after_rollback items

    @property
    def vars(self) -> dict[str, Any]:
        """The play's variables in the order they are rendered: vars, vars_files, roles' vars."""
        return {**self.model.vars, **self.more_vars}

    @property
    def name(self) -> str:
        return self.model.name or f"play {self.index + 1} ({self.model.hosts})"

    def has_module(self, name: str) -> bool:
        return any(t.module.name == name for t in self.tasks)


@dataclass
class Playbook:
    path: Path
    plays: list[Play]
    digest: str = ""
    errors: list[str] = field(default_factory=list)

    def tasks(self) -> Iterator[Task]:
        for play in self.plays:
            yield from play.tasks


