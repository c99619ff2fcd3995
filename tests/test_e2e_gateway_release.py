"""The SGLang Model Gateway deployed as a release, like any server: a spec whose service is
``python -m smg launch ...`` (the real smg 1.13.0 wheel in the host's venv) deploys, switches and
rolls back on a lab host; its launch args are checked by smg's own parser (never SGLang's), and
its gate is its own ``/readiness`` (200 once a worker behind it is healthy). Behind it, a stand-in
SGLang server on another lab host answers requests routed through the deployed gateway."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli
from gateway_support import stream_once
from lab_support import LabHandle, user_inventory
from service_cleanup import clean_releases
from sglang_support import make_venv, wheel

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
GW_ENV, WORKER_ENV = "/root/smg-env", "/root/standin-env"
CLEAN = clean_releases("/opt/fleetctl", GW_ENV, WORKER_ENV)
GW_PORT = 30080


@pytest.fixture
def gw_lab(lab_fleet: LabHandle, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """lab1 serves a stand-in SGLang; lab2 has smg 1.13.0 (and setproctitle, all `smg launch` imports)
    in a venv of its own, installed from the wheels on PyPI."""
    lab = lab_fleet
    for host in ("lab1", "lab2"):
        lab.ssh(host, CLEAN)
    make_venv(lab, "lab2", GW_ENV, [wheel("smg", "1.13.0"), wheel("setproctitle", "1.3.8")], fresh=True)
    lab.ssh("lab1", f"/usr/bin/python3 -m venv --without-pip {WORKER_ENV}")
    inventory = user_inventory(lab, tmp_path / "inventory.yml", "root")
    worker = tmp_path / "worker.yml"
    worker.write_text(f'name: worker\nversion: "1"\nbase: {{adopt: {WORKER_ENV}}}\n'
                      "service: {standin: true}\nhealth: {timeout: 30, interval: 0.2}\n")
    env = {"lab": lab, "inv": inventory, "folder": tmp_path, "worker": f"http://{lab.addresses['lab1']}:30000"}
    yield env
    for host in ("lab1", "lab2"):
        lab.ssh(host, CLEAN)


def gateway_spec(env: dict[str, Any], version: str, policy: str) -> Path:
    """The gateway as a release: smg in front of lab1's server, its metrics on its own address."""
    path = env["folder"] / f"gw-{version}.yml"
    path.write_text(yaml.safe_dump({
        "name": "gateway", "version": version, "base": {"adopt": GW_ENV}, "requires": {"smg": "==1.13.0"},
        "service": {"module": "smg", "port": GW_PORT,
                    "args": ["launch", "--policy", policy, "--worker-urls", env["worker"],
                             "--prometheus-host", "{{ ansible_host }}", "--prometheus-port", "29000",
                             "--log-level", "warn"]},
        # smg's own readiness: 200 once a worker is healthy behind it (/health is its liveness only)
        "health": {"path": "/readiness", "timeout": 60, "interval": 0.2}}, sort_keys=False))
    return path


def cli(capsys: pytest.CaptureFixture[str], env: dict[str, Any], *args: str) -> CliRun:
    return run_cli(capsys, "-i", str(env["inv"]), *args)


def routed(env: dict[str, Any]) -> tuple[list[str], tuple[int, str]]:
    """The deployed gateway's workers, and one streamed completion through it."""
    base = f"http://{env['lab'].addresses['lab2']}:{GW_PORT}"
    workers = json.loads(urllib.request.urlopen(base + "/workers", timeout=10).read())["workers"]
    return [w["url"] for w in workers], stream_once(base, 5, timeout=60)


def test_the_gateway_deploys_switches_and_rolls_back_as_a_release(
        gw_lab: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    env = gw_lab
    served = cli(capsys, env, "-l", "lab1", "deploy", "-y", str(env["folder"] / "worker.yml"))
    assert served.rc == 0, served.out + served.err
    bad = cli(capsys, env, "-l", "lab2", "deploy", str(gateway_spec(env, "bad", "fastest")), "--check", "--json")
    assert bad.rc != 0, bad.out + bad.err
    assert "smg 1.13.0 rejects the launch args: smg launch: error: argument --policy: invalid choice: 'fastest'" \
        in bad.out + bad.err
    assert "sglang" not in (bad.out + bad.err).split("rejects the launch args", 1)[1].split("\n", 1)[0]

    one, two = gateway_spec(env, "1", "round_robin"), gateway_spec(env, "2", "random")
    for spec in (one, two):
        r = cli(capsys, env, "-l", "lab2", "deploy", "-y", str(spec), "--json")
        assert r.rc == 0, r.out + r.err + env["lab"].ssh("lab2", "tail -c 3000 /var/lib/fleetctl/service/*.log",
                                                          check=False).stdout
        value = r.json()["hosts"]["lab2"]["value"]
        assert value["launch"]["detail"].startswith("accepted by smg 1.13.0's parser")
        assert [g["name"] for g in value["gates"]] == ["GET /readiness"]  # its own endpoint, no more
        assert routed(env) == ([env["worker"]], (5, ""))
    status = cli(capsys, env, "-l", "lab2", "status", "--json").json()["hosts"]["lab2"]["value"]
    assert status["current"] == load_spec(two).release_id
    assert status["argv"][1:4] == ["-m", "smg", "launch"] and "random" in status["argv"]

    back = cli(capsys, env, "-l", "lab2", "rollback", "-y", "--json")
    assert back.rc == 0, back.out + back.err
    status = cli(capsys, env, "-l", "lab2", "status", "--json").json()["hosts"]["lab2"]["value"]
    assert status["current"] == load_spec(one).release_id and "round_robin" in status["argv"]
    assert status["health"] == "200"
    assert routed(env) == ([env["worker"]], (5, ""))


def test_the_gateway_as_a_release_as_a_non_root_operator_with_become(
        gw_lab: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """Production's login: fleetop with sudo (-b) deploys the gateway release, switches it and rolls
    it back; smg's own parser checks its args in the release's venv, and requests route through it."""
    env = gw_lab
    served = cli(capsys, env, "-l", "lab1", "deploy", "-y", str(env["folder"] / "worker.yml"))
    assert served.rc == 0, served.out + served.err
    fleetop = user_inventory(env["lab"], env["folder"] / "fleetop.yml")

    def as_fleetop(*args: str) -> CliRun:
        return run_cli(capsys, "-i", str(fleetop), "-b", "-l", "lab2", *args)

    one, two = gateway_spec(env, "1", "round_robin"), gateway_spec(env, "2", "random")
    for spec in (one, two):
        r = as_fleetop("deploy", "-y", str(spec), "--json")
        assert r.rc == 0, r.out + r.err
        assert r.json()["hosts"]["lab2"]["value"]["launch"]["detail"].startswith("accepted by smg 1.13.0's parser")
        assert routed(env) == ([env["worker"]], (5, ""))
    back = as_fleetop("rollback", "-y", "--json")
    assert back.rc == 0, back.out + back.err
    status = as_fleetop("status", "--json").json()["hosts"]["lab2"]["value"]
    assert status["current"] == load_spec(one).release_id and "round_robin" in status["argv"]
    assert routed(env) == ([env["worker"]], (5, ""))
    owner = env["lab"].ssh("lab2", f"stat -c %U /opt/fleetctl/releases/{load_spec(two).release_id}").stdout.strip()
    assert owner == "root"  # written through sudo, not as fleetop
