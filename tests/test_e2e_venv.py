"""``venv overlay`` and ``venv create`` on the lab fleet with real wheels (sglang, requests and its
compiled charset-normalizer with a console script), each result audited by ``drift``."""

from __future__ import annotations

import csv
import io
import json
import shlex
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
from cli_support import CliRun, run_cli
from lab_support import LabHandle
from sglang_support import NEW_SGLANG, OLD_SGLANG, WHEEL_CACHE, make_venv, visible_wheel, wheel, wheel_set

from fleetctl.cli.main import main

pytestmark = pytest.mark.lab
SRC = "/root/ov-src"
SITE = "lib/python3.11/site-packages"
REQUESTS = "requests==2.32.3"


def _cli(capsys: pytest.CaptureFixture[str], lab: LabHandle, *args: str, inventory: Path | None = None) -> CliRun:
    return run_cli(capsys, "-i", str(inventory or lab.inventory_path), *args)


def _fresh(lab: LabHandle, host: str, venv: str) -> None:
    q = shlex.quote(venv)
    lab.ssh(host, f"rm -rf {q} && /usr/bin/python3 -m venv {q}")


def _overlay(capsys: pytest.CaptureFixture[str], lab: LabHandle, limit: str, *args: str) -> CliRun:
    return _cli(capsys, lab, "-l", limit, "venv", "overlay", "--from", "lab1", "--venv", SRC, *args, "--json")


def _drift_clean(capsys: pytest.CaptureFixture[str], lab: LabHandle, limit: str, *args: str,
                 inventory: Path | None = None) -> CliRun:
    r = _cli(capsys, lab, "-l", limit, "drift", "--verify-files", "--baseline", "lab1", "--skip", "unsatisfied",
             *args, "--json", inventory=inventory)
    assert r.rc == 0, r.out[-3000:] + r.err
    return r


@pytest.fixture(scope="module")
def ov_lab(lab_fleet: LabHandle) -> LabHandle:
    """lab1: /root/ov-src holds sglang 0.5.23 and requests with its dependencies, pip-installed."""
    make_venv(lab_fleet, "lab1", SRC, [wheel("sglang", NEW_SGLANG), *wheel_set(REQUESTS)], fresh=True)
    return lab_fleet


def test_fresh_venv_then_nothing_to_change(ov_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    _fresh(ov_lab, "lab2", SRC)
    dry = _overlay(capsys, ov_lab, "lab2", "--dry-run")
    assert dry.rc == 0, dry.err
    plan = {d["name"]: d for d in dry.json()["hosts"]["lab2"]["value"]["dists"]}
    assert plan["sglang"]["action"] == "add" and plan["sglang"]["send"] > 5000
    assert ov_lab.ssh("lab2", f"ls {SRC}/{SITE} | grep -c sglang", check=False).stdout.strip() == "0"
    r = _overlay(capsys, ov_lab, "lab2")
    assert r.rc == 0, r.out[-2000:] + r.err
    applied = r.json()["hosts"]["lab2"]["value"]["applied"]
    assert applied["written"] > 5000 and applied["manifest"].startswith("/var/lib/fleetctl/overlays/")
    doc = _drift_clean(capsys, ov_lab, "lab1,lab2", "--venv", SRC).json()
    origins = [f for f in doc["hosts"]["lab2"]["findings"] if f["kind"] == "overlay"]
    assert any(f["package"] == "sglang" and "overlay from lab1:/root/ov-src at " in f["detail"] for f in origins)
    again = _overlay(capsys, ov_lab, "lab2")
    assert again.rc == 0 and again.json()["line"] == "1 targets: 0 changed, 1 nothing to change"
    assert again.json()["hosts"]["lab2"]["value"]["applied"] is None


def test_upgrade_leaves_no_stale_file_and_one_dist_info(ov_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    make_venv(ov_lab, "lab3", SRC, [wheel("sglang", OLD_SGLANG)], fresh=True)
    r = _overlay(capsys, ov_lab, "lab3", "--packages", "sglang", "--compress", "6")  # through the controller, zlib
    assert r.rc == 0, r.out[-2000:] + r.err
    (sglang,) = r.json()["hosts"]["lab3"]["value"]["dists"]
    assert (sglang["action"], sglang["old_version"], sglang["new_version"]) == ("upgrade", OLD_SGLANG, NEW_SGLANG)
    assert sglang["remove"] > 0  # 0.5.9 files that 0.5.23 no longer has
    infos = ov_lab.ssh("lab3", f"ls -d {SRC}/{SITE}/sglang-*.dist-info").stdout.split()
    assert infos == [f"{SRC}/{SITE}/sglang-{NEW_SGLANG}.dist-info"]
    leftovers = ov_lab.ssh("lab3", f"find {SRC} -name '*.fleetctl-tmp*' | wc -l").stdout.strip()
    assert leftovers == "0"
    _drift_clean(capsys, ov_lab, "lab1,lab3", "--venv", SRC, "--packages", "sglang")


def test_other_path_rewrites_scripts_and_they_run(ov_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    other = "/root/ov-other"
    _fresh(ov_lab, "lab2", other)
    names = ("requests", "charset-normalizer", "idna", "urllib3", "certifi")
    pkgs = [p for name in names for p in ("--packages", name)]
    r = _overlay(capsys, ov_lab, "lab2", "--to-venv", other, *pkgs)
    assert r.rc == 0, r.out[-2000:] + r.err
    script = f"{other}/bin/normalizer"
    assert ov_lab.ssh("lab2", f"head -1 {script}").stdout.strip() == f"#!{other}/bin/python"
    ran = ov_lab.ssh("lab2", f"{script} --version", check=False)
    assert ran.returncode == 0 and "Charset-Normalizer" in ran.stdout + ran.stderr, ran.stderr
    ok = ov_lab.ssh("lab2", f"{other}/bin/python -c 'import requests, charset_normalizer.md'", check=False)
    assert ok.returncode == 0, ok.stderr  # the compiled extension loads
    inventory = ov_lab.dir / "inventory-ov-other.yml"
    text = ov_lab.inventory_path.read_text()
    inventory.write_text(text.replace("ansible_python_interpreter: /usr/bin/python3",
                                      "ansible_python_interpreter: /usr/bin/python3\n          venv: VENV")
                         .replace("VENV", SRC, 1).replace("VENV", other, 1).replace("VENV", SRC, 1))
    _drift_clean(capsys, ov_lab, "lab1,lab2", *pkgs, inventory=inventory)


def cp312_wheel(project: str, version: str) -> Path:
    folder = WHEEL_CACHE / "cp312"

    def cached() -> list[Path]:
        prefix = f"{project.lower()}-{version}-cp312-"
        return sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix))

    found = cached()
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--platform", "manylinux2014_x86_64", "-d", str(folder),
                        f"{project}=={version}"], check=True)
        found = cached()
    assert found, "no cp312 wheel downloaded"
    return found[0]


def test_cp312_extension_is_refused_before_anything_is_written(
    ov_lab: LabHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, target = "/root/ov-bad", "/root/ov-bad-dst"
    _fresh(ov_lab, "lab1", bad)
    whl = visible_wheel(ov_lab, cp312_wheel("PyYAML", "6.0.2"))
    unzip = f"import zipfile; zipfile.ZipFile({whl!r}).extractall({bad + '/' + SITE!r})"
    ov_lab.ssh("lab1", f"/usr/bin/python3 -c {shlex.quote(unzip)}")
    _fresh(ov_lab, "lab2", target)
    before = ov_lab.ssh("lab2", f"find {target} | sort | md5sum").stdout
    r = _cli(capsys, ov_lab, "-l", "lab2", "venv", "overlay", "--from", "lab1", "--venv", bad, "--to-venv", target,
             "--json")
    assert r.rc == 2, r.out
    reason = r.json()["hosts"]["lab2"]["reason"]
    assert reason.startswith("refused, nothing written: pyyaml 6.0.2: WHEEL tag cp312-cp312-")
    assert "cpython-312-x86_64-linux-gnu" in reason and "python 3.11" in reason
    assert ov_lab.ssh("lab2", f"find {target} | sort | md5sum").stdout == before  # nothing written


def _hashes_on(lab: LabHandle, host: str, folder: str) -> dict[str, str]:
    code = (
        "import base64,hashlib,json,os,sys\n"
        "out={}\n"
        "for r,d,f in os.walk(sys.argv[1]):\n"
        "  d[:]=[x for x in d if x!='__pycache__']\n"
        "  for n in f:\n"
        "    p=os.path.join(r,n); h=hashlib.sha256(open(p,'rb').read()).digest()\n"
        "    out[os.path.relpath(p,os.path.dirname(sys.argv[1]))]=base64.urlsafe_b64encode(h).rstrip(b'=').decode()\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(lab.ssh(host, f"/usr/bin/python3 -c {shlex.quote(code)} {shlex.quote(folder)}").stdout)


def _record_hashes(whl: Path) -> dict[str, str]:
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(z.read(name).decode())))
    return {r[0]: r[1].partition("=")[2] for r in rows if len(r) > 1 and r[1]}


def test_killed_overlay_leaves_old_or_new_files_and_a_rerun_completes(
    scratch_lab: LabHandle, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = wheel("sglang", OLD_SGLANG), wheel("sglang", NEW_SGLANG)
    make_venv(scratch_lab, "lab1", SRC, [new], fresh=True)
    make_venv(scratch_lab, "lab2", SRC, [old], fresh=True)
    monkeypatch.setenv("FLEETCTL_OVERLAY_THROTTLE_S", "0.004")
    outcome: dict[str, int] = {}
    args = ["-i", str(scratch_lab.inventory_path), "-l", "lab2", "venv", "overlay", "--from", "lab1", "--venv", SRC,
            "--json"]
    thread = threading.Thread(target=lambda: outcome.setdefault("rc", main(args)))
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the target is writing once its journal exists
        probe = scratch_lab.ssh("lab2", "ls /var/lib/fleetctl/overlays/ | grep -c inflight", check=False)
        if probe.stdout.strip() not in ("", "0"):
            break
        assert thread.is_alive(), f"the overlay ended before lab2 began writing: {outcome}"
        time.sleep(0.2)
    else:
        raise AssertionError(f"lab2 never began the overlay within 120s (last: {probe.stdout.strip()!r})")
    time.sleep(3)
    scratch_lab.stop("lab2")
    thread.join(120)
    assert outcome.get("rc") == 2
    monkeypatch.delenv("FLEETCTL_OVERLAY_THROTTLE_S")
    scratch_lab.start("lab2")
    old_hashes, new_hashes = _record_hashes(old), _record_hashes(new)
    seen = _hashes_on(scratch_lab, "lab2", f"{SRC}/{SITE}/sglang")
    torn = [p for p, h in seen.items() if not p.endswith(".fleetctl-tmp") and h not in (old_hashes.get(p),
                                                                                          new_hashes.get(p))]
    assert not torn, torn[:5]
    assert any(new_hashes.get(p) == h != old_hashes.get(p) for p, h in seen.items())  # it was cut midway
    assert any(old_hashes.get(p) == h != new_hashes.get(p) for p, h in seen.items())
    r = run_cli(capsys, *args)
    assert r.rc == 0, r.out[-2000:] + r.err
    assert r.json()["hosts"]["lab2"]["value"]["resumes"] is True
    leftovers = scratch_lab.ssh("lab2", f"find {SRC} -name '*.fleetctl-tmp' | wc -l").stdout.strip()
    assert leftovers == "0"
    drift = run_cli(capsys, "-i", str(scratch_lab.inventory_path), "drift", "--verify-files", "--baseline", "lab1",
                    "--venv", SRC, "--skip", "unsatisfied", "--json")
    assert drift.rc == 0, drift.out[-3000:]


def test_venv_create_from_lock_offline_is_idempotent_and_clean(
    lab_fleet: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheels = wheel_set(REQUESTS)
    house = tmp_path / "wheelhouse"
    house.mkdir()
    lock = tmp_path / "fleet.lock"
    lines = []
    for w in wheels:
        (house / w.name).write_bytes(w.read_bytes())
        name, version = w.name.split("-")[:2]
        lines.append(f"{name.replace('_', '-')}=={version}")
    lock.write_text("\n".join(lines) + "\n")
    venv = "/root/vc-env"
    for host in ("lab2", "lab3"):
        lab_fleet.ssh(host, f"rm -rf {venv}")
    args = ("-l", "lab2,lab3", "venv", "create", "--venv", venv, "--python", "3.11", "--lock", str(lock),
            "--wheelhouse", str(house), "--json")
    first = _cli(capsys, lab_fleet, *args)
    assert first.rc == 0, first.out + first.err
    for host in ("lab2", "lab3"):
        value = first.json()["hosts"][host]["value"]
        assert value["created"] and len(value["installed"]) == len(wheels) and value["uploaded"] >= 0
    assert lab_fleet.ssh("lab2", "ls /var/lib/fleetctl/wheelhouse/ | wc -l").stdout.strip() == str(len(wheels))
    second = _cli(capsys, lab_fleet, *args)
    assert second.rc == 0
    for host in ("lab2", "lab3"):
        value = second.json()["hosts"][host]["value"]
        assert (value["changed"], value["summary"], value["uploaded"]) == (False, "nothing to change", 0)
    drift = _cli(capsys, lab_fleet, "-l", "lab2,lab3", "drift", "--venv", venv, "--lock", str(lock),
                 "--verify-files", "--json")
    assert drift.rc == 0, drift.out[-3000:]


def test_venv_create_uses_uv_when_the_host_has_it(
    lab_fleet: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uv_wheel = wheel("uv", "0.5.31")
    with zipfile.ZipFile(uv_wheel) as z:
        binary = z.read(next(n for n in z.namelist() if n.endswith(".data/scripts/uv")))
    target = lab_fleet.dir / "hosts" / "lab1" / "root" / ".local" / "bin" / "uv"  # lab1's private /root
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(binary)
    target.chmod(0o755)
    try:
        house = tmp_path / "wheelhouse"
        house.mkdir()
        idna = next(w for w in wheel_set(REQUESTS) if w.name.startswith("idna-"))
        (house / idna.name).write_bytes(idna.read_bytes())
        lock = tmp_path / "idna.lock"
        lock.write_text(f"idna=={idna.name.split('-')[1]}\n")
        lab_fleet.ssh("lab1", "rm -rf /root/vc-uv")
        args = ("-l", "lab1", "venv", "create", "--venv", "/root/vc-uv", "--lock", str(lock), "--wheelhouse",
                str(house), "--json")
        r = _cli(capsys, lab_fleet, *args)
        assert r.rc == 0, r.out + r.err
        value = r.json()["hosts"]["lab1"]["value"]
        assert value["installer"] == "uv" and value["commands"][0]["argv"][1] == "venv"
        assert lab_fleet.ssh("lab1", "cat /root/vc-uv/lib/python3.11/site-packages/idna-*.dist-info/INSTALLER") \
            .stdout.strip() == "uv"
        assert _cli(capsys, lab_fleet, *args).json()["hosts"]["lab1"]["value"]["summary"] == "nothing to change"
        drift = _cli(capsys, lab_fleet, "-l", "lab1", "drift", "--venv", "/root/vc-uv", "--lock", str(lock),
                     "--verify-files")
        assert drift.rc == 0, drift.out
    finally:
        target.unlink()


DIRECT_SRC, DIRECT_DST = "/root/ov-direct-src", "/root/ov-direct-dst"
DIRECT_PKGS = ("requests", "charset-normalizer", "idna", "urllib3", "certifi")


def _give_ssh(lab: LabHandle, target: str, source: str | None) -> list[Path]:
    """The lab client key in the target's private /root/.ssh, and (when ``source``) the source's
    pinned host key in its known_hosts; the files written, to remove afterwards."""
    ssh_dir = lab.dir / "hosts" / target / "root" / ".ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ssh_dir / "id_ed25519"
    key.write_bytes(lab.key_path.read_bytes())
    key.chmod(0o600)
    written = [key]
    if source is not None:
        address = lab.addresses[source]
        lines = [line for line in lab.known_hosts.read_text().splitlines()
                 if address in line.split(" ", 1)[0].split(",") or f"[{address}]" in line.split(" ", 1)[0]]
        assert lines, f"no pinned key for {source} in {lab.known_hosts}"
        known = ssh_dir / "known_hosts"
        known.write_text("\n".join(lines) + "\n")
        written.append(known)
    return written


def _direct_lab(lab: LabHandle, target: str) -> None:
    make_venv(lab, "lab1", DIRECT_SRC, wheel_set(REQUESTS))
    _fresh(lab, target, DIRECT_DST)


def test_direct_overlay_pulls_from_the_source_itself(lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    _direct_lab(lab_fleet, "lab2")
    written = _give_ssh(lab_fleet, "lab2", "lab1")
    try:
        base = ("-l", "lab2", "venv", "overlay", "--from", "lab1", "--venv", DIRECT_SRC, "--to-venv", DIRECT_DST,
                "--direct")
        human = _cli(capsys, lab_fleet, *base, "--packages", "idna")
        assert human.rc == 0, human.out[-2000:] + human.err
        assert "lab2: done (direct from the source):" in human.out, human.out
        pkgs = [p for name in DIRECT_PKGS for p in ("--packages", name)]
        r = _cli(capsys, lab_fleet, *base, *pkgs, "--compress", "1", "--json")  # a zlib stream, pulled direct
        assert r.rc == 0, r.out[-2000:] + r.err
        doc = r.json()
        assert doc["direct"] is True
        applied = doc["hosts"]["lab2"]["value"]["applied"]
        assert applied["via"] == "direct" and applied["written"] > 50
        script = f"{DIRECT_DST}/bin/normalizer"
        assert lab_fleet.ssh("lab2", f"head -1 {script}").stdout.strip() == f"#!{DIRECT_DST}/bin/python"
    finally:
        for path in written:
            path.unlink()
    inventory = lab_fleet.dir / "inventory-ov-direct.yml"
    text = lab_fleet.inventory_path.read_text()
    inventory.write_text(text.replace("ansible_python_interpreter: /usr/bin/python3",
                                      "ansible_python_interpreter: /usr/bin/python3\n          venv: VENV")
                         .replace("VENV", DIRECT_SRC, 1).replace("VENV", DIRECT_DST, 1).replace("VENV", DIRECT_SRC, 1))
    _drift_clean(capsys, lab_fleet, "lab1,lab2", *pkgs, inventory=inventory)
    again = _cli(capsys, lab_fleet, *base, *pkgs, "--json")
    assert again.rc == 0 and again.json()["line"] == "1 targets: 0 changed, 1 nothing to change"


def test_direct_overlay_without_the_pinned_key_fails_clearly_and_writes_nothing(
    lab_fleet: LabHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    _direct_lab(lab_fleet, "lab3")
    state = "ls /var/lib/fleetctl/overlays/ 2>/dev/null | sort | md5sum"
    before = (lab_fleet.ssh("lab3", f"find {DIRECT_DST} | sort | md5sum").stdout, lab_fleet.ssh("lab3", state).stdout)
    written = _give_ssh(lab_fleet, "lab3", None)  # a key, but lab1's host key is not pinned
    try:
        r = _cli(capsys, lab_fleet, "-l", "lab3", "venv", "overlay", "--from", "lab1", "--venv", DIRECT_SRC,
                 "--to-venv", DIRECT_DST, "--direct", "--json")
    finally:
        for path in written:
            path.unlink()
    assert r.rc == 2, r.out[-2000:] + r.err
    assert r.json()["hosts"]["lab3"]["reason"] == (
        "lab3 cannot reach lab1 directly: Host key verification failed; "
        "pin lab1's key in lab3's ~/.ssh/known_hosts or drop --direct")
    after = (lab_fleet.ssh("lab3", f"find {DIRECT_DST} | sort | md5sum").stdout, lab_fleet.ssh("lab3", state).stdout)
    assert after == before  # nothing written: neither the venv nor a journal or manifest
