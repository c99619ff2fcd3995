"""Rollout arithmetic, pure: ``serial`` steps into batches, and the failure budgets.

As Ansible: each step is a host count or a percentage of the play's hosts (rounded down, at
least 1); the last step repeats until every host has had its batch; the first batch is the canary.
``max_fail_percentage`` is exceeded when a batch's failed share is strictly greater; ``max_failures``
counts failed and unreachable hosts across the whole rollout and is exceeded past that number.
Without either budget, failed hosts drop out and the others go on, unless a whole batch failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


def step_size(step: int | str, total: int) -> int:
    if isinstance(step, int):
        return step
    return max(1, int(total * float(step.rstrip("%")) / 100))


def batches(hosts: Sequence[T], serial: Sequence[int | str] | None,
            group_of: Callable[[T], object] | None = None) -> list[list[T]]:
    """Split ``hosts`` (in order) into the play's batches. With ``group_of`` (a host's value of the
    play's ``serial_group_var``: the nodes of one multi-node server), hosts of one group move
    together: a group joins its first host's batch, and a batch that would split one grows to hold
    it whole (hosts without a value are groups of one)."""
    if not hosts:
        return []
    if not serial:
        return [list(hosts)]
    units = _units(hosts, group_of)
    out: list[list[T]] = []
    i, n = 0, 0
    while i < len(units):
        size = step_size(serial[min(n, len(serial) - 1)], len(hosts))
        batch: list[T] = []
        while i < len(units) and (not batch or len(batch) + len(units[i]) <= size):
            batch += units[i]
            i += 1
        out.append(batch)
        n += 1
    return out


def group_of(fleet: Any, var: str | None) -> Callable[[str], object] | None:
    """A host's value of ``var`` (its multi-node group), read from the fleet's host variables."""
    if not var:
        return None
    return lambda host: fleet.contexts[host].vars.get(var) if host in fleet.contexts else None


def _units(hosts: Sequence[T], group_of: Callable[[T], object] | None) -> list[list[T]]:
    """Hosts gathered by group, each group where its first host is (without ``group_of``: one each)."""
    units: list[list[T]] = []
    where: dict[object, list[T]] = {}
    for host in hosts:
        key = group_of(host) if group_of else None
        if key is None or key == "":
            units.append([host])
        elif key in where:
            where[key].append(host)
        else:
            where[key] = [host]
            units.append(where[key])
    return units


@dataclass(frozen=True)
class Budget:
    max_fail_percentage: float | None = None
    max_failures: int | None = None
    any_errors_fatal: bool = False

    def exceeded(self, batch_failed: int, batch_size: int, total_failed: int) -> str | None:
        """Why the rollout must stop after this batch, or None to go on."""
        if self.any_errors_fatal and batch_failed:
            return f"any_errors_fatal: {batch_failed} host(s) failed"
        if self.max_failures is not None and total_failed > self.max_failures:
            return f"max_failures {self.max_failures} exceeded: {total_failed} host(s) failed in this rollout"
        if self.max_fail_percentage is not None and batch_size:
            share = 100.0 * batch_failed / batch_size
            if share > self.max_fail_percentage:
                return (f"max_fail_percentage {self.max_fail_percentage:g}% exceeded: {batch_failed} of "
                        f"{batch_size} host(s) in the batch failed ({share:.0f}%)")
        explicit = self.max_failures is not None or self.max_fail_percentage is not None
        if not explicit and batch_size and batch_failed == batch_size:
            return f"every host of the batch failed ({batch_failed})"  # Ansible stops here too
        return None
