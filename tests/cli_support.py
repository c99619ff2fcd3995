"""Run the real CLI entry point in-process and capture what a user would see."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from fleetctl.cli.main import main


@dataclass
class CliRun:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> CliRun:
    capsys.readouterr()
    rc = main(list(args))
    captured = capsys.readouterr()
    return CliRun(rc, captured.out, captured.err)


@dataclass
class Wall:
    seconds: float = 0.0


@contextmanager
def wall_clock() -> Iterator[Wall]:
    """Wall time of the block, measured by the test (never the product's own report of it)."""
    took, start = Wall(), time.monotonic()
    try:
        yield took
    finally:
        took.seconds = time.monotonic() - start
