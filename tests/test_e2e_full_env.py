"""The whole story on the FULL SGLang 0.5.23 environment (issue 16), not on ``sglang --no-deps``.

lab1 (golden) gets the 207-distribution closure through fleetctl itself: ``venv create --lock
playbooks/files/locks/sglang-0.5.23-full.lock`` from the machine's hash-checked wheelhouse
(scripts/wheelhouse.py, ``make wheels``), at /opt/ml-env, one mount with /opt/fleetctl. lab2
(stale) is the seed's hybrid: the same closure (hard links of lab1's files, made from the
controller: a stand-in for a second identical install that costs no disk) with an older host's
sglang 0.5.9 copied over it by hand. Then, as an operator would: ``drift`` names what differs
(no --skip), ``probe symbol`` shows the definitions apart, ``venv overlay --from lab1`` brings
lab2 level, ``drift --verify-files`` is clean, the plain release deploys onto both; launch args
are judged by the installed SGLang's own parser before the switch (issue 17: a flag 0.5.23 rejects
is refused in ``deploy --check`` and ``deploy``, so is an instance's override SGLang does not know,
the DDTree flag only after its patches); the DDTree
release deploys onto both and rolls back. Everything this module made is removed at the end.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from cli_support import CliRun, run_cli
from lab_support import REPO, LabHandle
from service_cleanup import clean_releases
from sglang_support import OLD_SGLANG, visible_wheel, wheel

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
VENV = "/opt/ml-env"
SITE = f"{VENV}/lib/python3.11/site-packages"
LOCK = REPO / "playbooks/files/locks/sglang-0.5.23-full.lock"
WHEELS = os.environ.get("FLEETCTL_FULL_WHEELS", "/var/cache/fleetctl-wheels/sglang-0.5.23")
RELEASES = REPO / "playbooks/releases"
PLAIN, DDTREE = RELEASES / "sglang-0.5.23-full-lab.yml", RELEASES / "ddtree-sglang-0.5.23-full-lab.yml"
HYBRID_LINEAR = "sglang/srt/layers/attention/hybrid_linear_attn_backend.py"
TIMES: dict[str, float] = {}
BUILDS: dict[str, dict] = {}
CLEAN_RELEASES = clean_releases()  # as conftest's release_free_lab


def cli(capsys: pytest.CaptureFixture[str], lab: LabHandle, *args: str) -> CliRun:
    started = time.monotonic()
    r = run_cli(capsys, "-i", str(lab.inventory_path), "-e", f"fleetctl_wheelhouse={WHEELS}", *args)
    TIMES[" ".join(Path(a).name if a.startswith("/") else a for a in args)[:80]] = round(time.monotonic() - started, 1)
    return r


def host_path(lab: LabHandle, host: str, path: str) -> Path:
    """Where a lab host's private /opt lies on this machine."""
    assert path.startswith("/opt/")
    return lab.dir / "hosts" / host / "opt" / path[len("/opt/"):]


KEEP = bool(os.environ.get("FLEETCTL_FULL_ENV_KEEP"))  # for working on this test: lab1's venv kept


def _clean(lab: LabHandle) -> None:
    started = time.monotonic()
    commands = {host: CLEAN_RELEASES + ("" if KEEP and host == "lab1" else f"; rm -rf {VENV}")
                for host in ("lab1", "lab2")}
    with ThreadPoolExecutor(2) as pool:  # both hosts at once: ~460,000 unlinks
        list(pool.map(lab.ssh, commands, commands.values()))
    TIMES[f"clean {'start' if 'clean start' not in TIMES else 'end'}"] = round(time.monotonic() - started, 1)


def make_stale(lab: LabHandle) -> None:
    """lab2: lab1's closure as hard links, then sglang 0.5.9's files copied over it by hand (the
    sglang folder first made lab2's own, so nothing written there reaches lab1's inodes)."""
    started = time.monotonic()
    golden, stale = host_path(lab, "lab1", VENV), host_path(lab, "lab2", VENV)
    subprocess.run(["cp", "-al", str(golden), str(stale)], check=True)
    pkg = shlex.quote(f"{SITE}/sglang")
    old = visible_wheel(lab, wheel("sglang", OLD_SGLANG))
    unzip = f"import zipfile; zipfile.ZipFile({old!r}).extractall({SITE!r})"
    lab.ssh("lab2", f"set -e; cp -a {pkg} {pkg}.own && rm -rf {pkg} && mv {pkg}.own {pkg}; "
                    f"/usr/bin/python3 -c {shlex.quote(unzip)}")
    TIMES["make_stale"] = round(time.monotonic() - started, 1)


@pytest.fixture(scope="module")
def full_lab(lab_fleet: LabHandle) -> Iterator[LabHandle]:
    subprocess.run([sys.executable, str(REPO / "scripts/wheelhouse.py"), "fetch", str(LOCK), WHEELS], check=True)
    _clean(lab_fleet)
    yield lab_fleet
    _clean(lab_fleet)
    print("\nfull-env timings (s):", TIMES, "\nbuilds:", BUILDS)


def findings(r: CliRun, host: str) -> list[dict]:
    return r.json()["hosts"][host]["findings"]


ACCEPTED = "accepted by sglang 0.5.23's parser"


def variant(spec: Path, path: Path, *extra: str) -> Path:
    """``spec`` (one without patches) with ``extra`` appended to its launch args."""
    doc = yaml.safe_load(spec.read_text())
    assert not doc.get("patches")
    doc["service"]["args"] += list(extra)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def with_instances(spec: Path, path: Path, b_args: list[str]) -> Path:
    """``spec`` served as two instances on lab1: a on its own port with --tp 4, b with ``b_args``."""
    doc = yaml.safe_load(spec.read_text())
    doc["service"]["instances"] = [{"name": "a", "port": 30021, "args": ["--tp", "4", "--enable-metrics"]},
                                   {"name": "b", "port": 30022, "args": b_args}]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def deployed(capsys: pytest.CaptureFixture[str], lab: LabHandle, spec: Path, rid: str) -> None:
    r = cli(capsys, lab, "-l", "lab1,lab2", "deploy", str(spec), "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    for host in ("lab1", "lab2"):
        value = r.json()["hosts"][host]["value"]
        assert value["outcome"] == "deployed" and value["release_id"] == rid, value
        assert value["launch"]["validated"] and value["launch"]["detail"].startswith(ACCEPTED), value["launch"]
        TIMES[f"build {rid} {host}"] = value["build"].get("seconds", -1)
        BUILDS[f"{rid} {host}"] = value["build"]


def refused(capsys: pytest.CaptureFixture[str], lab: LabHandle, spec: Path, rejected: str, current: str,
            *check: str, instance: str = "") -> None:
    """lab1 refuses ``spec`` with SGLang's own line, before the switch: ``current`` stays."""
    r = cli(capsys, lab, "-l", "lab1", "deploy", str(spec), *check, "--json")
    assert r.rc == 2, r.out[-3000:] + r.err
    whose = f" of instance {instance}" if instance else ""
    said = r.json()["hosts"]["lab1"]["reason"]
    assert said == (f"sglang 0.5.23 rejects the launch args{whose}: sglang serve: error: unrecognized arguments: "
                    f"{rejected}; nothing switched"), r.out
    assert lab.ssh("lab1", "readlink /opt/fleetctl/current").stdout.strip() == f"releases/{current}"
    left = lab.ssh("lab1", "ls /opt/fleetctl/releases").stdout.split()
    assert current in left and load_spec(spec).release_id not in left  # a refused release leaves no folder


@pytest.mark.timeout(1200)  # venv create of 207 wheels is most of it (about 4 min on 2 busy cores)
def test_the_whole_story_on_the_full_environment(full_lab: LabHandle, capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    lab = full_lab
    # Golden: provisioned through fleetctl from the lock and the wheelhouse already on the host.
    r = cli(capsys, lab, "-l", "lab1", "venv", "create", "--venv", VENV, "--python", "3.11", "--lock", str(LOCK),
            "--wheelhouse", WHEELS, "--no-compile", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    made = r.json()["hosts"]["lab1"]["value"]
    assert KEEP or (made["created"] and len(made["installed"]) == 207 and made["uploaded"] == 0)
    make_stale(lab)

    # drift names what differs, with no --skip: pip-check semantics, versions, files.
    r = cli(capsys, lab, "-l", "lab1,lab2", "drift", "--venv", VENV, "--baseline", "lab1", "--verify-files", "--json")
    assert r.rc == 1, r.out[-3000:] + r.err
    golden = findings(r, "lab1")
    assert {f["kind"] for f in golden} == {"shared-file"}, golden  # a complete venv is clean
    (shared,) = golden
    owners = ["flashinfer-python", "torch-c-dlpack-ext"]
    assert shared["package"] in owners  # whichever pip installed last
    other = next(o for o in owners if o != shared["package"])
    assert shared["detail"] == (f"lib/python3.11/site-packages/build_backend.py shared by {other} and "
                                f"{shared['package']}; {shared['package']}'s copy is installed")
    stale = findings(r, "lab2")
    kinds = {f["kind"] for f in stale}
    assert {"duplicate-dist-info", "modified-file", "orphan-file", "unsatisfied"} <= kinds, kinds
    assert all(f["package"] == "sglang" for f in stale if f["kind"] in ("duplicate-dist-info", "modified-file"))

    # grep over the whole installed sglang, twice: the second from each host's grep cache.
    grep = ("probe", "grep", "update_mamba_state_after_mtp_verify", "DFLASH", "--venv", VENV, "--json")
    first = cli(capsys, lab, "-l", "lab1,lab2", *grep).json()["hosts"]
    second = cli(capsys, lab, "-l", "lab1,lab2", *grep).json()["hosts"]
    for host in ("lab1", "lab2"):  # lab2's files just written are read again until they are 2 s old
        assert second[host]["value"]["files"] == first[host]["value"]["files"]
    assert second["lab1"]["value"]["cached_files"] == second["lab1"]["value"]["searched_files"] + \
        second["lab1"]["value"]["binary_files"]

    # The definitions apart: lab1's own definition in the hybrid backend is not on lab2.
    r = cli(capsys, lab, "-l", "lab1,lab2", "probe", "symbol", "update_mamba_state_after_mtp_verify",
            "--venv", VENV, "--json")
    assert r.rc == 0, r.err
    defs = {h: {(d["path"], d["line"]) for d in r.json()["hosts"][h]["value"]["definitions"]} for h in ("lab1", "lab2")}
    golden_hybrid = {d for d in defs["lab1"] if d[0] == HYBRID_LINEAR}
    assert golden_hybrid and not golden_hybrid & defs["lab2"] and (HYBRID_LINEAR, 1695) in defs["lab2"]

    # overlay from the golden host: the cp310-abi3 sglang-kernel is not refused; lab2 comes level.
    r = cli(capsys, lab, "-l", "lab2", "venv", "overlay", "--from", "lab1", "--venv", VENV, "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    plan = {d["name"]: d for d in r.json()["hosts"]["lab2"]["value"]["dists"]}
    # sglang: "same" by version (0.5.23 is the newest dist-info there) but its files and the 0.5.9
    # dist-info are repaired; nothing else of the 207 changes.
    assert plan["sglang"]["send"] > 100 and plan["sglang"]["remove"] > 0 and plan["sglang-kernel"]["action"] == "same"
    assert [n for n, d in plan.items() if d["changes"]] == ["sglang"] and len(plan) >= 207
    assert lab.ssh("lab2", f"ls -d {SITE}/sglang-*.dist-info").stdout.split() == [f"{SITE}/sglang-0.5.23.dist-info"]
    r = cli(capsys, lab, "-l", "lab1,lab2", "drift", "--venv", VENV, "--baseline", "lab1", "--verify-files", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert {f["kind"] for f in findings(r, "lab2")} <= {"shared-file", "overlay"}
    r = cli(capsys, lab, "-l", "lab2", "venv", "overlay", "--from", "lab1", "--venv", VENV, "--dry-run", "--json")
    assert r.rc == 0 and not r.json()["hosts"]["lab2"]["value"]["changes"], r.out[-3000:]  # level: nothing to send
    # The overlay rewrote lab2's sglang files: its grep cache answers as a full read does, and as lab1.
    cached = cli(capsys, lab, "-l", "lab1,lab2", *grep).json()["hosts"]
    fresh = cli(capsys, lab, "-l", "lab1,lab2", *grep, "--no-cache").json()["hosts"]
    for host in ("lab1", "lab2"):
        assert cached[host]["value"]["files"] == fresh[host]["value"]["files"] == first["lab1"]["value"]["files"]
        assert cached[host]["value"]["counts"] == fresh[host]["value"]["counts"]
    assert first["lab2"]["value"]["counts"] != first["lab1"]["value"]["counts"]  # the stale host differed before

    # The plain release on both, then launch args judged by the installed SGLang's own parser before
    # anything switches (issue 17), then the DDTree release over it, its patches applied to the full
    # venv's files (its flag known to the patched parser only); rollback.
    plain, ddtree = load_spec(PLAIN).release_id, load_spec(DDTREE).release_id
    deployed(capsys, lab, PLAIN, plain)
    stale_flag = variant(PLAIN, tmp_path / "stale-flag.yml", "--mamba-scheduler-strategy", "extra_buffer")
    refused(capsys, lab, stale_flag, "--mamba-scheduler-strategy extra_buffer", plain, "--check")
    refused(capsys, lab, stale_flag, "--mamba-scheduler-strategy extra_buffer", plain)
    # Each instance's own argv (base args + its overrides) goes through the parser too (issue 18):
    # a's valid override passes (the instances are parsed in order), b's unknown flag is refused.
    # (--check only from here on: deploy runs the same host-side check, after a build, as above.)
    sick = with_instances(PLAIN, tmp_path / "pair-sick.yml", ["--tp", "4", "--no-such-flag", "1"])
    refused(capsys, lab, sick, "--no-such-flag 1", plain, "--check", instance="b")
    ddtree_flag = variant(PLAIN, tmp_path / "ddtree-flag.yml", "--speculative-ddtree-budget", "64")
    refused(capsys, lab, ddtree_flag, "--speculative-ddtree-budget 64", plain, "--check")  # unpatched: unknown
    r = cli(capsys, lab, "-l", "lab1", "deploy", str(DDTREE), "--check", "--json")  # patched files from memory
    assert r.rc == 0, r.out[-3000:] + r.err
    assert r.json()["hosts"]["lab1"]["value"]["launch"]["detail"].startswith(ACCEPTED), r.out[-3000:]
    deployed(capsys, lab, DDTREE, ddtree)
    links = lab.ssh("lab1", f"stat -c %h {SITE}/torch/lib/libtorch_cuda.so").stdout.strip()
    assert int(links) >= 3  # the base and both releases share the inode: hard links, not copies
    r = cli(capsys, lab, "-l", "lab1,lab2", "drift", "--venv", f"/opt/fleetctl/releases/{ddtree}/venv",
            "--baseline", "lab1", "--verify-files", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert any(f["kind"] == "patched" for f in findings(r, "lab2"))
    r = cli(capsys, lab, "-l", "lab1,lab2", "rollback", "--json")
    assert r.rc == 0, r.out[-3000:] + r.err
    assert lab.ssh("lab2", "readlink /opt/fleetctl/current").stdout.strip() == f"releases/{plain}"
