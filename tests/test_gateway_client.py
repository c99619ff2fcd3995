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
from fleetctl.gateway.workers import gateways_of, worker_url


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


def test_router_status_lists_each_gateways_workers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A host of this machine (local connection, no release on it) behind a real gateway with one
    stand-in worker that no inventory host serves: listed, healthy; no router_url is a usage error."""
    from cli_support import run_cli

    plain = tmp_path / "plain.yml"
    plain.write_text("all:\n  hosts:\n    ctl: {ansible_connection: local}\n")
    r = run_cli(capsys, "-i", str(plain), "router", "status")
    assert (r.rc, r.err.strip()) == (3, "fleetctl: error: no gateway: set router_url (a URL or a list) for the "
                                         "hosts behind one")
    with processes() as procs:
        worker, _ = start_stand_in(procs)
        url = start_gateway(procs, tmp_path / "smg.log")
        Gateway(url).add(worker)
        until(lambda: any(w.healthy for w in Gateway(url).workers()), "healthy")
        inv = tmp_path / "inv.yml"
        inv.write_text(f"all:\n  vars: {{router_url: '{url}'}}\n  hosts:\n    ctl: {{ansible_connection: local}}\n")
        shown = run_cli(capsys, "-i", str(inv), "router", "status", "--json")
        assert shown.rc == 0, shown.out + shown.err
        (gateway,) = shown.json()["gateways"]
        assert [(w["url"], w["status"], w["healthy"], w["why"]) for w in gateway["workers"]] == [
            (worker, "ready", True, "no selected inventory host serves this URL")]
        table = run_cli(capsys, "-i", str(inv), "router", "status")
        assert url in table.out and worker in table.out and "ready" in table.out
