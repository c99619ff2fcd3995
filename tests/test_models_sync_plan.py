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


def test_a_hf_snapshot_sends_each_blob_once_and_links_every_path() -> None:
    from fleetctl.models.fanout import wire_files

    a, b = "a" * 64, "b" * 64
    manifest = {"files": [{"path": "model.safetensors", "size": 9, "sha256": a},
                          {"path": "copy/model.safetensors", "size": 9, "sha256": a},
                          {"path": "config.json", "size": 3, "sha256": b}]}
    blobs = {"model.safetensors": a, "copy/model.safetensors": a, "config.json": "c" * 40}
    files, links = wire_files(manifest, blobs)
    assert files == [[a, 9, a], ["c" * 40, 3, b]]
    assert links == [["model.safetensors", a], ["copy/model.safetensors", a], ["config.json", "c" * 40]]
    assert wire_files(manifest, {}) == ([[f["path"], f["size"], f["sha256"]] for f in manifest["files"]], [])


def test_a_locked_path_is_refused_naming_the_holder() -> None:
    line = "being synced by alice@ctl pid 42 (models sync /srv/m) since 10:00:00 UTC; its node is pid 7 on this host"
    assert refusal("gpu4", {"complete": False, "locked": line}, "/srv/m") == f"gpu4: /srv/m is {line}"
