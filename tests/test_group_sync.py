"""A batch's multi-node groups in step (release/group_sync.py), with threads as the hosts' passes run them."""

from __future__ import annotations

import threading

import pytest

from fleetctl.errors import HostError
from fleetctl.release.gates import GateResult
from fleetctl.release.group_sync import GroupSync, verdict
from fleetctl.release.service_ops import ServiceResult

GROUP = {"a0": {"nnodes": 2, "node_rank": 0, "dist_init_addr": "10.0.0.1:20000"},
         "a1": {"nnodes": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:20000"},
         "solo": {"nnodes": 1, "node_rank": 0, "dist_init_addr": "10.0.0.3:20000"}}


def test_a_rank_waits_for_its_rank_0s_drain_and_is_let_go_by_it() -> None:
    sync = GroupSync(GROUP)
    said: list[str] = []
    waiting = threading.Thread(target=lambda: said.append(sync.wait_leader("a1", 60)))
    waiting.start()
    waiting.join(timeout=0.2)
    assert waiting.is_alive()  # rank 0 has said nothing yet
    sync.leader_drained("a0", True)
    waiting.join(timeout=60)
    assert said == ["rank 0 (a0) drained before this node stopped"]
    assert sync.wait_leader("solo", 0) == "" and sync.wait_leader("a0", 0) == ""  # nobody else waits


def test_a_rank_0_that_could_not_drain_or_ended_leaves_its_ranks_untouched() -> None:
    sync = GroupSync(GROUP)
    sync.leader_drained("a0", False, "drain deadline: 1 requests still in flight")
    with pytest.raises(HostError, match=r"rank 0 \(a0\) was not drained \(drain deadline: 1 requests"):
        sync.wait_leader("a1", 60)
    ended = GroupSync(GROUP)
    ended.finish("a0", False, "locked by another run")
    with pytest.raises(HostError, match="it ended without draining: locked by another run"):
        ended.wait_leader("a1", 60)


def test_a_rank_without_its_rank_0_in_the_batch_is_refused_unless_returning() -> None:
    alone = {"a1": GROUP["a1"]}
    with pytest.raises(HostError, match=r"rank 0 of its group \(10.0.0.1:20000\) is not in this batch"):
        GroupSync(alone).wait_leader("a1", 60)
    assert GroupSync(alone, leaderless_ok=True).wait_leader("a1", 60) == ""


def test_rank_0_returns_to_the_gateway_only_once_every_rank_passed() -> None:
    sync = GroupSync(GROUP)
    failed = ServiceResult("a1", "restart", "r1", gates=[GateResult("GET /health", False, "HTTP 503")])
    threading.Timer(0.1, lambda: sync.finish("a1", *verdict(failed))).start()
    assert sync.wait_members("a0", 60) == ["rank 1 (a1) failed: GET /health: HTTP 503"]
    passed = GroupSync(GROUP)
    passed.finish("a1", True, "")
    assert passed.wait_members("a0", 60) == []


def test_with_fewer_threads_than_a_group_rank_0_does_not_wait_for_ranks_that_cannot_run_yet() -> None:
    assert GroupSync(GROUP, threads=1).wait_members("a0", 60) == []
