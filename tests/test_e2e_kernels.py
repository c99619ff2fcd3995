"""Tuned fused-MoE configs end to end on the lab fleet, with the real sglang wheels: ``kernels plan``
per host, then releases whose config folder is SGLang's built-in configs of the installed 0.5.23
merged with tuned ones (tuned win on a clash), named by SGLANG_MOE_CONFIG_DIR in the service's
environment, invisible to ``drift --verify-files``, and switched back by a rollback.

Lab hosts have no GPU and no triton: the host vars ``gpu_name`` and ``triton_version`` stand in."""

from __future__ import annotations

import hashlib
import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli
from lab_support import LabHandle
from sglang_support import ML_VENV, NEW_SGLANG, wheel

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab

SITE = f"{ML_VENV}/lib/python3.11/site-packages"
BUILTIN = f"{SITE}/sglang/srt/layers/moe/moe_runner/triton_utils/configs"
CLASH = "E=128,N=192,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"  # sglang 0.5.23 ships triton_3_4_0/ of it
NEW = "E=256,N=256,device_name=NVIDIA_H200.json"  # Qwen3.6-35B-A3B-like at TP 2: not built in
OTHER_GPU = "E=96,N=256,device_name=NVIDIA_B200.json"  # another GPU: never shipped
CURRENT = "/opt/fleetctl/current"
HOST_VARS = {"lab1": {"gpu_name": "NVIDIA H200", "triton_version": "3.4.0"},
             "lab2": {"gpu_name": "NVIDIA H200", "triton_version": "3.4.0"},
             "lab3": {"gpu_name": "NVIDIA H200", "triton_version": "3.5.0"}}  # no triton_3_5_0 folder anywhere



@pytest.fixture
def inventory(release_free_lab: LabHandle) -> Iterator[str]:
    """A copy of the lab inventory with gpu_name / triton_version host vars, beside the original."""
    doc = yaml.safe_load(release_free_lab.inventory_path.read_text())
    for name, extra in HOST_VARS.items():
        doc["all"]["children"]["lab"]["hosts"][name].update(extra)
    path = release_free_lab.dir / f"inventory-kernels-{os.getpid()}.yml"
    path.write_text(yaml.safe_dump(doc))
    yield str(path)
    path.unlink(missing_ok=True)


def config(block_m: int) -> str:
    entry = {"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 3}
    return json.dumps({"1": entry, "64": dict(entry, BLOCK_SIZE_M=64)}, indent=1) + "\n"


def release(tmp_path: Path, tag: str, block_m: int) -> tuple[Path, dict[str, str]]:
    """A release spec in tmp_path with its own tuned folder; answers the spec and the tuned texts."""
    tuned = {CLASH: config(block_m), NEW: config(block_m * 2), OTHER_GPU: config(32)}
    folder = tmp_path / f"tuned-{tag}" / "triton_3_4_0"
    folder.mkdir(parents=True)
    for name, text in tuned.items():
        (folder / name).write_text(text)
    spec = tmp_path / f"kernels-e2e-{tag}.yml"
    spec.write_text(textwrap.dedent(f"""\
        name: kernels-e2e-{tag}
        version: "{NEW_SGLANG}"
        base: {{adopt: {ML_VENV}}}
        requires: {{sglang: "=={NEW_SGLANG}"}}
        kernels: {{dir: tuned-{tag}}}
        service:
          standin: true
          args: [--model-path, /models/Qwen3.6-35B-A3B, --speculative-algorithm, DFLASH]
        health: {{timeout: 60, interval: 0.2, probes: [{{symbol: SpeculativeAlgorithm.DFLASH}}]}}
        """))
    return spec, tuned


def cli(capsys: pytest.CaptureFixture[str], inventory: str, *args: str) -> CliRun:
    return run_cli(capsys, "-i", inventory, *args)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def remote_sha(lab: LabHandle, host: str, path: str) -> str:
    return lab.ssh(host, f"sha256sum '{path}'").stdout.split()[0]


def builtin_count() -> int:
    """The built-in triton_* configs of the sglang wheel the lab hosts have."""
    import zipfile

    prefix = "sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_"
    with zipfile.ZipFile(wheel("sglang", NEW_SGLANG)) as zf:
        return sum(1 for n in zf.namelist() if n.startswith(prefix) and n.endswith(".json"))


def test_plan_per_host_with_stand_in_vars(inventory: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    spec, _ = release(tmp_path, "plan", 16)
    r = cli(capsys, inventory, "kernels", "plan", "--venv", ML_VENV, "--dir", str(spec.parent / "tuned-plan"),
            "--json")
    assert r.rc == 0, r.err
    hosts = {h: v["value"] for h, v in r.json()["hosts"].items()}
    lab1, lab2, lab3 = hosts["lab1"], hosts["lab2"], hosts["lab3"]
    assert lab1["facts"]["gpu_source"] == "host var gpu_name: nvidia-smi not found"
    assert lab1["facts"]["triton_source"] == f"host var triton_version: triton not installed in {ML_VENV}"
    assert (lab1["facts"]["sglang_version"], lab1["facts"]["builtin_dir"]) == (NEW_SGLANG, BUILTIN)
    assert lab1["selected"] == [f"triton_3_4_0/{CLASH}", f"triton_3_4_0/{NEW}"]  # not the B200 file
    assert {e["filename"]: e["status"] for e in lab1["entries"]} == {CLASH: "exact", NEW: "exact"}
    assert lab1["warnings"] == []
    # lab3's triton 3.5.0 has no folder: SGLang falls back (the clash name to triton_3_4_0, newest holding it)
    assert lab3["warnings"][0].startswith("no triton_3_5_0 folder at all (built-in or tuned): SGLang falls back")
    assert {e["filename"]: (e["loads"], e["status"]) for e in lab3["entries"]} == {
        CLASH: ("triton_3_4_0", "fallback"), NEW: ("triton_3_4_0", "fallback")}
    # lab2 runs sglang 0.5.9: the older layout, and its fixed list of triton versions
    assert lab2["facts"]["builtin_dir"].endswith("/sglang/srt/layers/moe/fused_moe_triton/configs")
    assert lab2["facts"]["fixed_order"] == ["3.4.0", "3.3.1", "3.2.0", "3.1.0"]
    human = cli(capsys, inventory, "-l", "lab3", "kernels", "plan", "--venv", ML_VENV, "--dir",
                str(spec.parent / "tuned-plan"))
    flat = " ".join(human.out.split())
    assert "host var gpu_name: nvidia-smi not found" in flat and "FALLBACK" in flat, human.out
    assert "performance might be sub-optimal" in flat


def check_release_folder(lab: LabHandle, host: str, tuned: dict[str, str]) -> None:
    """current/kernels/configs = every built-in triton_* file + the new tuned one; tuned win the clash."""
    configs = f"{CURRENT}/kernels/configs"
    count = lab.ssh(host, f"find {configs} -name '*.json' | wc -l").stdout.strip()
    assert int(count) == builtin_count() + 1
    assert remote_sha(lab, host, f"{configs}/triton_3_4_0/{CLASH}") == sha(tuned[CLASH])
    assert remote_sha(lab, host, f"{configs}/triton_3_4_0/{NEW}") == sha(tuned[NEW])
    builtin = "triton_3_1_0/E=16,N=1024,device_name=NVIDIA_H200.json"
    assert remote_sha(lab, host, f"{configs}/{builtin}") == remote_sha(lab, host, f"{BUILTIN}/{builtin}")
    assert lab.ssh(host, f"test -e {configs}/triton_3_4_0/{OTHER_GPU}", check=False).returncode == 1


def check_service_env(lab: LabHandle, host: str) -> None:
    """The env file names the folder, the running service has it, and SGLang's path exists there."""
    env = lab.ssh(host, f"cat {CURRENT}/service.env").stdout
    assert f"SGLANG_MOE_CONFIG_DIR={CURRENT}/kernels" in env.splitlines()
    environ = lab.ssh(host, "tr '\\0' '\\n' < /proc/$(head -1 /var/lib/fleetctl/service/sglang.pid)/environ").stdout
    assert f"SGLANG_MOE_CONFIG_DIR={CURRENT}/kernels" in environ.splitlines()
    # what SGLang opens: $SGLANG_MOE_CONFIG_DIR/configs/triton_<triton.__version__>/<name>
    assert lab.ssh(host, f"test -f {CURRENT}/kernels/configs/triton_3_4_0/{CLASH}", check=False).returncode == 0


def base_fingerprint(lab: LabHandle, host: str) -> str:
    return lab.ssh(host, f"cd {BUILTIN} && find . -type f | sort | xargs -d '\\n' sha256sum | sha256sum").stdout


def deploy(capsys: pytest.CaptureFixture[str], inventory: str, spec: Path) -> dict[str, Any]:
    r = cli(capsys, inventory, "-l", "lab1,lab3", "deploy", str(spec), "--json")
    assert r.rc == 0, r.out + r.err
    hosts: dict[str, Any] = r.json()["hosts"]
    assert {h: v["value"]["outcome"] for h, v in hosts.items()} == {"lab1": "deployed", "lab3": "deployed"}
    return hosts


def test_release_ships_merged_configs_drift_clean_and_rollback(
        release_free_lab: LabHandle, inventory: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab = release_free_lab
    first, tuned1 = release(tmp_path, "one", 16)
    second, tuned2 = release(tmp_path, "two", 32)
    base_before = base_fingerprint(lab, "lab1")
    check = cli(capsys, inventory, "-l", "lab1", "deploy", str(first), "--check", "--diff")
    assert check.rc == 0 and "SGLANG_MOE_CONFIG_DIR=/opt/fleetctl/current/kernels" in check.out, check.out + check.err
    deploy(capsys, inventory, first)
    for host in ("lab1", "lab3"):
        check_release_folder(lab, host, tuned1)
        check_service_env(lab, host)
    manifest = json.loads(lab.ssh("lab1", f"cat {CURRENT}/manifest.json").stdout)
    assert manifest["kernels"]["tuned"] == [f"triton_3_4_0/{CLASH}", f"triton_3_4_0/{NEW}"]
    assert manifest["kernels"]["replaced_builtin"] == [f"triton_3_4_0/{CLASH}"]
    assert manifest["kernel_files"][f"kernels/configs/triton_3_4_0/{CLASH}"] == sha(tuned1[CLASH])

    # the configs live in the release folder: the venv verifies clean, the base venv is untouched
    d = cli(capsys, inventory, "-l", "lab1", "drift", "--venv", f"{CURRENT}/venv", "--verify-files", "--skip",
            "unsatisfied", "--json")
    assert d.rc == 0 and d.json()["hosts"]["lab1"]["findings"] == [], d.out
    assert base_fingerprint(lab, "lab1") == base_before

    deploy(capsys, inventory, second)
    check_release_folder(lab, "lab1", tuned2)
    rb = cli(capsys, inventory, "-l", "lab1,lab3", "rollback", "--json")
    assert rb.rc == 0, rb.out + rb.err
    first_id = load_spec(first).release_id
    assert {h: v["value"]["to"] for h, v in rb.json()["hosts"].items()} == {"lab1": first_id, "lab3": first_id}
    for host in ("lab1", "lab3"):
        check_release_folder(lab, host, tuned1)  # the previous folder, with the first tuned texts
        check_service_env(lab, host)


def test_release_refused_where_no_gpu_name_is_known(release_free_lab: LabHandle, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    spec, _ = release(tmp_path, "blind", 16)
    before = release_free_lab.ssh("lab1", "ls /opt/fleetctl/releases 2>/dev/null; true").stdout
    r = cli(capsys, str(release_free_lab.inventory_path), "-l", "lab1", "deploy", str(spec), "--json")
    assert r.rc == 2
    assert r.json()["hosts"]["lab1"]["reason"] == ("kernels: no GPU name (nvidia-smi not found): set the host var "
                                                   "gpu_name; nothing changed")
    assert release_free_lab.ssh("lab1", "ls /opt/fleetctl/releases 2>/dev/null; true").stdout == before



# The real up/down pair sglang 0.5.9 and 0.5.23 both ship in triton_3_4_0 (BLOCK_SIZE_M 16 up to
# batch 256, 64 from 512 on, in both files).
H20_UP = "E=257,N=256,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json"
H20_DOWN = H20_UP.replace(".json", "_down.json")


def h20_tuned(tmp_path: Path, tag: str, text: str, name: str = H20_DOWN) -> Path:
    """A spec for sglang 0.5.9 hosts whose tuned folder holds one H20 file."""
    folder = tmp_path / f"tuned-{tag}" / "triton_3_4_0"
    folder.mkdir(parents=True)
    (folder / name).write_text(text)
    spec = tmp_path / f"h20-{tag}.yml"
    spec.write_text(f'name: h20-{tag}\nversion: "1"\nbase: {{adopt: {ML_VENV}}}\nrequires: {{sglang: "==0.5.9"}}\n'
                    f"kernels: {{dir: tuned-{tag}}}\nservice: {{standin: true}}\nhealth: {{timeout: 30}}\n")
    return spec


def test_up_down_block_size_m_rule_on_the_real_0_5_9_and_0_5_23_built_ins(
        release_free_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tuned _down file that disagrees with the built-in up config on BLOCK_SIZE_M from batch 512
    on: `kernels plan` exits 1 naming both files on lab2 (sglang 0.5.9 asserts they agree), lab1
    (0.5.23) is fine; a deploy to lab2 is refused in check mode and for real, nothing written. A
    file without num_warps/num_stages only warns there."""
    doc = yaml.safe_load(release_free_lab.inventory_path.read_text())
    for name in ("lab1", "lab2"):
        doc["all"]["children"]["lab"]["hosts"][name].update(gpu_name="NVIDIA H20", triton_version="3.4.0")
    inv = release_free_lab.dir / f"inventory-h20-{os.getpid()}.yml"  # beside the lab's known_hosts
    inv.write_text(yaml.safe_dump(doc))
    try:
        h20_cases(release_free_lab, str(inv), tmp_path, capsys)
    finally:
        inv.unlink(missing_ok=True)


def h20_cases(lab: LabHandle, inv: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = {"BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
    bad = h20_tuned(tmp_path, "bad", json.dumps({"1": dict(entry, BLOCK_SIZE_M=16),
                                                  "512": dict(entry, BLOCK_SIZE_M=32)}))
    plan = cli(capsys, inv, "-l", "lab1,lab2", "kernels", "plan", "--venv", ML_VENV, "--dir",
               str(bad.parent / "tuned-bad"), "--json")
    assert plan.rc == 1, plan.out + plan.err
    hosts = {h: v["value"] for h, v in plan.json()["hosts"].items()}
    refusal = (f"triton_3_4_0/{H20_DOWN} (tuned): BLOCK_SIZE_M differs from triton_3_4_0/{H20_UP} (built-in) for "
               "batch size 512, 1024, 1536, 2048, 3072...: sglang 0.5.9 asserts they agree (0.5.23 and later do not)")
    assert hosts["lab2"]["refusals"] == [refusal]
    assert hosts["lab1"]["refusals"] == []
    before = lab.ssh("lab2", "ls /opt/fleetctl/releases 2>/dev/null; true").stdout
    for mode in (("--check",), ()):
        r = cli(capsys, inv, "-l", "lab2", "deploy", str(bad), *mode, "--json")
        assert r.rc == 2, r.out + r.err
        assert r.json()["hosts"]["lab2"]["reason"] == f"kernels: {refusal}"
    assert lab.ssh("lab2", "ls /opt/fleetctl/releases 2>/dev/null; true").stdout == before

    bare = {k_: v for k_, v in entry.items() if k_ not in ("num_warps", "num_stages")}
    # (as the built-in pair: BLOCK_SIZE_M 16, then 64 from batch 512 on)
    grid = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]  # the built-in's keys
    plain = h20_tuned(tmp_path, "bare", json.dumps({str(b): dict(bare, BLOCK_SIZE_M=16 if b < 512 else 64)
                                                    for b in grid}), H20_UP)
    warned = cli(capsys, inv, "-l", "lab2", "kernels", "plan", "--venv", ML_VENV, "--dir",
                 str(plain.parent / "tuned-bare"), "--json")
    assert warned.rc == 0, warned.out + warned.err
    lab2 = warned.json()["hosts"]["lab2"]["value"]
    assert lab2["refusals"] == [] and f"triton_3_4_0/{H20_UP}: batch size 1, 2, 4, 8, 16... has no " \
        "num_warps/num_stages: SGLang loads it with Triton's defaults (as some of its own configs)" in lab2["warnings"]
    check = cli(capsys, inv, "-l", "lab2", "deploy", str(plain), "--check", "--json")
    assert check.rc == 0, check.out + check.err
