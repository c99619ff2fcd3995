"""Run the real CLI entry point in-process and capture what a user would see."""

from __future__ import annotations

import json
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
