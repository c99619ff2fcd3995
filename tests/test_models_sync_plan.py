"""models sync's pure parts: the rate option, the one-line refusals, and the ssh a host runs to reach the
next one (every jump host named, host keys checked, a sudo that would prompt refused at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.cli.models_sync import parse_rate
from fleetctl.errors import InputError
from fleetctl.models.chain import jump_spec
from fleetctl.models.fanout import refusal
from fleetctl.transport.target import SSHTarget


@pytest.mark.parametrize(("text", "rate"), [("50M", 50e6), ("50MB/s", 50e6), ("400k", 400e3), ("1g", 1e9),
                                            ("2.5M", 2.5e6), ("1000", 1000.0), (None, 0.0)])
def test_rates_read_as_rsync_reads_them(text: str | None, rate: float) -> None:
    assert parse_rate(text) == rate


def test_a_bad_rate_is_one_line() -> None:
    with pytest.raises(InputError, match=r"^--limit-rate fast: a rate such as 50M, 50MB/s or 400k$"):
        parse_rate("fast")


def test_refusals_name_the_host_the_path_and_the_numbers() -> None:
    assert refusal("gpu4", {"complete": False, "free": 1000, "room_needed": 5000}, "/srv/m") == (
        "gpu4: no room for the model: 1,000 B free on the volume of /srv/m, 5,000 B needed")
    assert refusal("gpu4", {"foreign": True, "complete": False, "free": 0}, "/srv/m") == (
        "gpu4: /srv/m exists and is not this model revision (no matching manifest); remove it or sync to another path")
    assert refusal("gpu4", {"complete": True, "free": 0, "room_needed": 0}, "/srv/m") is None
    assert refusal("gpu4", {"complete": False, "free": 5000, "room_needed": 5000}, "/srv/m") is None


def test_every_jump_host_is_named_outermost_first() -> None:
    kh = Path("/k")
    outer = SSHTarget("bastion.example", 2222, "ops", kh, 5.0)
    inner = SSHTarget("10.0.0.1", 22, "ops", kh, 5.0, jump=outer)
    target = SSHTarget("10.0.0.2", 22, "root", kh, 5.0, jump=inner)
    assert jump_spec(target) == "ops@bastion.example:2222,ops@10.0.0.1:22"
