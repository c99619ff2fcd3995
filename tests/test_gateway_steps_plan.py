"""``--check`` plans of the gateway steps (release/gateway_steps.py) for a multi-node server's nodes:
each says the wait for rank 0 a real run takes, a playbook ``service`` task's plan included."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fleetctl.release import gateway_steps
from fleetctl.release.service import layout_for

NODE = {"router_url": "http://127.0.0.1:9", "nnodes": 2, "dist_init_addr": "10.0.0.1:20000"}


def plan(rank: int, op: str) -> list[str]:
    session: Any = SimpleNamespace(name=f"n{rank}", vars={**NODE, "node_rank": rank})
    steps = gateway_steps.service_plan(session, layout_for(session.vars), [None], op)
    return [f"{g.name}: {g.detail}" for g in steps]


def test_a_service_plan_of_a_rank_1_says_it_would_wait_for_its_rank_0() -> None:
    line = ("gateway: would wait for its rank 0: rank 1 stops only once its rank 0 "
            "(dist_init_addr 10.0.0.1:20000) is out and drained")
    assert plan(1, "restart") == [line]
    assert plan(1, "stop") == [line]
    assert plan(1, "start") == []  # a start stops nothing: nobody to wait for
