"""``fleetctl.plain.plain`` answers exactly what ``dataclasses.asdict`` answers (it replaces it where a
fleet's worth of facts is turned into JSON, issue 37): on real captured facts, on 8-GPU facts with
their topology, and on every container shape asdict treats apart."""

from __future__ import annotations

import json
from collections import namedtuple
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from fleetctl.facts import HostFacts, parse_facts
from fleetctl.gpu.smi import parse_gpu_facts
from fleetctl.plain import plain

FIXTURES = Path(__file__).parent / "fixtures"
Pair = namedtuple("Pair", "left right")


class Colour(Enum):
    RED = "red"


@dataclass
class Inner:
    tags: set[str] = field(default_factory=lambda: {"a", "b"})
    pair: Pair = field(default_factory=lambda: Pair([1], {"k": 2}))


@dataclass
class Outer:
    name: str
    colour: Colour
    inner: Inner
    items: tuple[Inner, ...]
    by_index: dict[int, list[Inner]]
    counts: dict[str, int]
    nothing: None = None
    ratio: float = 0.5


def _h200() -> HostFacts:
    raw = json.loads((FIXTURES / "facts" / "h200-facts.json").read_text())
    raw_venv = json.loads((FIXTURES / "facts" / "h200-venv.json").read_text())
    return parse_facts(raw, raw_venv, "/opt/torch/.venv")


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (a tuple stays a tuple, an enum an enum)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_plain_is_asdict_on_captured_facts() -> None:
    facts = _h200()
    assert _same(plain(facts), asdict(facts))
    assert facts.to_dict()["gpu_health"]["level"] == "green"


def test_plain_is_asdict_on_eight_gpus_with_their_topology() -> None:
    folder = FIXTURES / "nvidia-smi" / "synthetic-hgx-h200-8x"
    ok = {"rc": 0, "stderr": "", "error": None}
    gpus = parse_gpu_facts({"path": "/usr/bin/nvidia-smi",
                            "xml": {**ok, "stdout": (folder / "nvidia-smi-q-x.xml").read_text()},
                            "topo": {**ok, "stdout": (folder / "topo-m.txt").read_text()}})
    assert gpus.count == 8 and gpus.topology is not None
    assert _same(gpus.to_dict(), asdict(gpus))


def test_plain_is_asdict_on_every_container_and_copies_as_deeply() -> None:
    one = Inner()
    obj = Outer("x", Colour.RED, one, (one, Inner({"c"})), {1: [one]}, {"a": 1})
    got = plain(obj)
    assert _same(got, asdict(obj))
    assert type(got["inner"]["pair"]) is Pair
    got["inner"]["tags"].add("changed")
    got["inner"]["pair"].left.append(9)
    assert one.tags == {"a", "b"} and one.pair.left == [1]  # nothing of obj is shared
