"""The gateway client against the real smg 1.13.0 (installed by make deps) and stand-in servers on
this machine: the worker API as the installed version answers it, a stream through the gateway, and
the inventory variable's checks."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from gateway_support import processes, start_gateway, start_stand_in, stream_once

from fleetctl.errors import InputError
from fleetctl.gateway.client import Gateway, GatewayError
from fleetctl.gateway.drain import gateways_of, worker_url


def until(check, what: str, seconds: float = 60):  # type: ignore[no-untyped-def]
    """Poll ``check()`` until it answers something true (bounded: a gateway that never does fails)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"never: {what}")


def test_worker_api_of_the_installed_smg(tmp_path: Path) -> None:
    with processes() as procs:
        worker, _ = start_stand_in(procs, "--decode-tps", "500")
        gw = Gateway(start_gateway(procs, tmp_path / "smg.log"))
        request = urllib.request.Request(gw.url + "/workers", json.dumps({"url": worker}).encode(),
                                         {"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 202
            first = json.loads(answer.read())["worker_id"]
        assert until(lambda: [w for w in gw.workers() if w.id == first and w.healthy], "healthy")[0].url == worker
        assert stream_once(gw.url, 20) == (20, "")  # SSE through the gateway, every token
        gw.remove(first)  # DELETE /workers/{uuid}: draining (no new requests), then gone
        until(lambda: all(w.status == "draining" for w in gw.workers()), "draining or gone", 30)
        until(lambda: not gw.workers(), "gone", 60)
        second = gw.add(worker)
        assert second and second != first  # a re-added URL gets a new id
        with pytest.raises(urllib.error.HTTPError) as legacy:
            urllib.request.urlopen(urllib.request.Request(f"{gw.url}/add_worker?url={worker}", b"", method="POST"),
                                   timeout=10)
        assert legacy.value.code == 404  # the old API is gone
        with pytest.raises(GatewayError, match="answered 400"):
            gw.remove("not-a-uuid")


def test_an_unreachable_gateway_is_one_line() -> None:
    with pytest.raises(GatewayError, match=r"^gateway http://127\.0\.0\.1:9 unreachable: "):
        Gateway("http://127.0.0.1:9", timeout=2).workers()


def test_router_url_is_a_url_or_a_list_of_urls() -> None:
    assert gateways_of("h", {}) == []
    assert gateways_of("h", {"router_url": "http://g:30000/"}) == ["http://g:30000"]
    assert gateways_of("h", {"router_url": ["http://a:1", "https://b:2"]}) == ["http://a:1", "https://b:2"]
    with pytest.raises(InputError, match="^h: router_url: 'g:30000' is not an http"):
        gateways_of("h", {"router_url": "g:30000"})
    with pytest.raises(InputError, match="^h: router_url must be a URL or a list"):
        gateways_of("h", {"router_url": 3})
    assert worker_url("h", {"ansible_host": "10.0.0.5"}, 30001) == "http://10.0.0.5:30001"
    assert worker_url("h", {"ansible_host": "a", "router_worker_host": "b"}, 1) == "http://b:1"
