"""A health check's verdict: its level (green, amber, red) and the value that decided it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Level(StrEnum):
    GREEN = "green"
    AMBER = "amber"
    RED = "red"

    @property
    def rank(self) -> int:
        return ("green", "amber", "red").index(self.value)


def worst(levels: list[Level]) -> Level:
    return max(levels, key=lambda lv: lv.rank, default=Level.GREEN)


@dataclass(frozen=True)
class Check:
    rule: str
    level: Level
    value: str  # what decided it, for a person: "volatile 2, aggregate 2"

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "level": self.level.value, "value": self.value}
