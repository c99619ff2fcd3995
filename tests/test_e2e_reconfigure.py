"""Day-2 changes on lab hosts: an inventory change reaches the serving release (a new --tp, a rotated
token, a moved port), as `deploy --check` predicted, and a bad one goes back to the configuration that
served; `rollback` goes back once, never onto a rejected release, and a re-run after a partial
failure moves only the hosts that did not make it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle, user_inventory
from reliability_support import TINY_BASE, assert_whole, release_state, tiny_releases, write_spec

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab

TUNED = """\
service:
  standin: true
  args: [--tp, "{{ tp_size }}"]
  env: {HF_TOKEN: "{{ hf_token }}"}
health: {timeout: 20, interval: 0.2}
"""


def running(lab: LabHandle, host: str) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the server process the host runs now (read from /proc)."""
    pid = release_state(lab, host)["service_pid"]
    assert pid, f"{host}: no server running"
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    env = dict(e.split("=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in e)
    return argv, env


def answers(lab: LabHandle, host: str, port: int) -> bool:
    probe = (f"/usr/bin/python3 -c \"import urllib.request as u; u.urlopen('http://{lab.addresses[host]}:{port}"
             f"/health', timeout=3)\"")
    return lab.ssh(host, probe, check=False).returncode == 0


def history(lab: LabHandle, host: str) -> list[dict]:
    return json.loads(lab.ssh(host, "cat /var/lib/fleetctl/state.json").stdout)["history"]


def test_inventory_changes_reach_the_serving_release(scratch_lab: LabHandle, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    lab = scratch_lab
    spec = write_spec(tmp_path, "tuned", TUNED, base=TINY_BASE, sglang=False)
    tiny_releases(lab, tmp_path, [])  # the tiny base venv on every host
    rid = load_spec(spec).release_id

    def deploy(host_vars: dict[str, object], *extra: str):  # type: ignore[no-untyped-def]
        inv = user_inventory(lab, tmp_path / "inv.yml", "root", {"lab1": host_vars})
        return run_cli(capsys, "-i", str(inv), "-l", "lab1", "deploy", str(spec), "--json", *extra)

    first = deploy({"tp_size": 2, "hf_token": "tokA"})
    assert first.rc == 0, first.out + first.err
    argv, env = running(lab, "lab1")
    assert argv[argv.index("--tp") + 1] == "2" and env["HF_TOKEN"] == "tokA"
    switches = len(history(lab, "lab1"))

    # tp_size 4 and a rotated token: check mode says what the real run then does, exactly
    new = {"tp_size": 4, "hf_token": "tokB"}
    plan = deploy(new, "--check", "--diff")
    assert plan.rc == 0, plan.out + plan.err
    planned = plan.json()["hosts"]["lab1"]["value"]
    assert (planned["plan"], planned["changed"]) == ("reconfigure", ["service.env", "service.json"])
    assert set(planned["diffs"]) == {"service.command", "service.env"}
    assert "HF_TOKEN=tokB\n" in planned["diffs"]["service.env"]
    done = deploy(new)
    assert done.rc == 0, done.out + done.err
    value = done.json()["hosts"]["lab1"]["value"]
    assert (value["outcome"], value["release_id"]) == ("reconfigured", rid)
    assert [g["name"] for g in value["gates"]] == ["GET /health"] and all(g["ok"] for g in value["gates"])
    argv, env = running(lab, "lab1")
    assert argv == shlex.split(planned["diffs"]["service.command"])  # what --check showed is what runs
    assert env["HF_TOKEN"] == "tokB"
    assert len(history(lab, "lab1")) == switches  # the same release: no switch, no rebuild
    again = deploy(new, "--check")
    assert (again.json()["hosts"]["lab1"]["value"]["plan"], again.json()["hosts"]["lab1"]["value"]["diffs"]) == (
        "unchanged", {})
    assert deploy(new).json()["hosts"]["lab1"]["value"]["outcome"] == "unchanged"

    # a new port: gated there, after the server moved
    moved = deploy({**new, "service_port": 30001})
    assert moved.rc == 0, moved.out + moved.err
    assert moved.json()["hosts"]["lab1"]["value"]["outcome"] == "reconfigured"
    assert answers(lab, "lab1", 30001) and not answers(lab, "lab1", 30000)

    # a port the server cannot take (sshd holds 22 on that address): back to the configuration that
    # served (port 30001, tokB), never to an older release
    bad = deploy({"tp_size": 8, "hf_token": "tokC", "service_port": 22})
    assert bad.rc == 2, bad.out + bad.err
    lab1 = bad.json()["hosts"]["lab1"]
    assert lab1["value"]["outcome"] == "config-restored"
    assert "back on the configuration that served" in lab1["reason"]
    assert all(g["ok"] for g in lab1["value"]["rollback_gates"]), lab1
    assert_whole(lab, "lab1", rid, base=TINY_BASE, port=30001)
    argv, env = running(lab, "lab1")
    assert argv[argv.index("--tp") + 1] == "4" and env["HF_TOKEN"] == "tokB"
    assert "tokC" not in lab.ssh("lab1", f"cat /opt/fleetctl/releases/{rid}/service.env").stdout
    assert len(history(lab, "lab1")) == switches


def test_rollback_goes_back_once_and_never_onto_a_rejected_release(
        scratch_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    a, b = tiny_releases(lab, tmp_path, ["rel-a", "rel-b"])
    sick = write_spec(tmp_path, "rel-sick", "service:\n  standin: true\n  args: [--standin-health-status, \"503\"]\n"
                                            "health: {timeout: 3, interval: 0.2}\n", base=TINY_BASE, sglang=False)
    ida, idb = load_spec(a).release_id, load_spec(b).release_id
    everyone = ("-i", inv, "-l", "lab1,lab2")
    for spec in (a, b):
        assert run_cli(capsys, *everyone, "deploy", str(spec)).rc == 0
    # lab1's canary of a bad release fails its gate and reverts to B: that release is rejected
    canary = run_cli(capsys, "-i", inv, "-l", "lab1", "deploy", str(sick), "--json")
    assert canary.rc == 2 and canary.json()["hosts"]["lab1"]["value"]["outcome"] == "rolled-back"

    plan = run_cli(capsys, *everyone, "rollback", "--check", "--json")
    assert plan.rc == 0, plan.out + plan.err
    assert {h: (v["value"]["outcome"], v["value"]["to"]) for h, v in plan.json()["hosts"].items()} == {
        "lab1": ("planned", ida), "lab2": ("planned", ida)}
    for host in lab.hosts:
        assert_whole(lab, host, idb, base=TINY_BASE)  # --check switched nothing

    # the first rollback reaches lab1 only: lab2 is down
    with lab.stop("lab2"):
        first = run_cli(capsys, *everyone, "rollback", "--json")
        assert first.rc == 2
        hosts = first.json()["hosts"]
        assert (hosts["lab1"]["value"]["outcome"], hosts["lab1"]["value"]["to"]) == ("rolled-back", ida)
        assert hosts["lab2"]["status"] == "unreachable"
    # re-run: lab2 goes back; lab1, already back, stays on A (not forward to B)
    second = run_cli(capsys, *everyone, "rollback", "--json")
    assert second.rc == 0, second.out + second.err
    hosts = second.json()["hosts"]
    assert (hosts["lab2"]["value"]["outcome"], hosts["lab2"]["value"]["to"]) == ("rolled-back", ida)
    assert hosts["lab1"]["value"]["outcome"] == "unchanged"
    assert hosts["lab1"]["value"]["note"].startswith(f"already rolled back from {idb} to {ida}")
    third = run_cli(capsys, *everyone, "rollback")
    assert third.rc == 0 and "--to RELEASE_ID goes further back" in " ".join(third.out.split())  # wrapped or not
    for host in lab.hosts:
        assert_whole(lab, host, ida, base=TINY_BASE)
    status = run_cli(capsys, *everyone, "status", "--json").json()["hosts"]
    assert {h: v["value"]["previous"] for h, v in status.items()} == {"lab1": None, "lab2": None}
    # an explicit id still goes anywhere on the host, a rejected release included
    fwd = run_cli(capsys, *everyone, "rollback", "--to", idb)
    assert fwd.rc == 0, fwd.out + fwd.err
    for host in lab.hosts:
        assert_whole(lab, host, idb, base=TINY_BASE)


def test_reconfigure_and_restore_as_a_non_root_operator_with_become(
        scratch_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """fleetop (sudo) with -b: the configuration is rewritten and restored as root writes it (service.env
    root's and 0600, the kept copy of what served too), and the server runs what was planned."""
    lab = scratch_lab
    spec = write_spec(tmp_path, "tuned", TUNED, base=TINY_BASE, sglang=False)
    tiny_releases(lab, tmp_path, [])
    rid = load_spec(spec).release_id

    def deploy(host_vars: dict[str, object]):  # type: ignore[no-untyped-def]
        inv = user_inventory(lab, tmp_path / "fleetop.yml", host_vars={"lab1": host_vars})  # login: fleetop
        return run_cli(capsys, "-i", str(inv), "-b", "-l", "lab1", "deploy", str(spec), "--json")

    assert deploy({"tp_size": 2, "hf_token": "tokA"}).rc == 0
    done = deploy({"tp_size": 4, "hf_token": "tokB"})
    assert done.rc == 0 and done.json()["hosts"]["lab1"]["value"]["outcome"] == "reconfigured", done.out + done.err
    argv, env = running(lab, "lab1")
    assert argv[argv.index("--tp") + 1] == "4" and env["HF_TOKEN"] == "tokB"
    bad = deploy({"tp_size": 8, "hf_token": "tokC", "service_port": 22})
    assert bad.rc == 2 and bad.json()["hosts"]["lab1"]["value"]["outcome"] == "config-restored", bad.out + bad.err
    argv, env = running(lab, "lab1")
    assert argv[argv.index("--tp") + 1] == "4" and env["HF_TOKEN"] == "tokB"
    env_file = f"/opt/fleetctl/releases/{rid}/service.env"
    assert lab.ssh("lab1", f"stat -c '%U %a' {env_file}").stdout.split() == ["root", "600"]
    assert lab.ssh("lab1", f"test -e /opt/fleetctl/releases/{rid}/.config-prev", check=False).returncode == 1
