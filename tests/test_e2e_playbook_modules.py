"""The playbook modules copy, template, probe, drift, kernels and venv, driven directly (as the runner
calls them) against the lab fleet's real sshd hosts and real sglang venvs (lab1, lab3: 0.5.23;
lab2: 0.5.9). What is checked is what a user would check on the host afterwards."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from lab_support import LabHandle
from sglang_support import ML_VENV, NEW_SGLANG, OLD_SGLANG, make_venv, wheel_set

from fleetctl.errors import HostError, InputError
from fleetctl.inventory import load_inventory
from fleetctl.playbook.modules import MODULES, ModuleContext, RunServices, TaskResult
from fleetctl.secrets import MASK
from fleetctl.transport.fleet import Fleet, RunSettings

pytestmark = pytest.mark.lab

SECRET = "hf_pbSECRETvalue42"
ROOT = "/srv/pbtest"  # a private folder of each lab host
HOST_VARS = {"lab1": {"gpu_name": "NVIDIA H200", "triton_version": "3.4.0"},
             "lab2": {"gpu_name": "NVIDIA H200", "triton_version": "3.4.0"},
             "lab3": {"gpu_name": "NVIDIA H200", "triton_version": "3.5.0"}}  # no triton_3_5_0 folder: fallback
TUNED = "E=256,N=256,device_name=NVIDIA_H200.json"
REQUESTS = "requests==2.32.3"

_env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


class Runner:
    """What the playbook runner gives a module: a ModuleContext per host over one shared fleet."""

    def __init__(self, fleet: Fleet, base_dir: Path) -> None:
        self.fleet = fleet
        self.base_dir = base_dir
        self.services = self.new_run()

    def new_run(self, **extra_vars: Any) -> RunServices:
        self.extra_vars = extra_vars
        self.services = RunServices(
            self.fleet.inventory, self.fleet.settings, {}, lambda text, v: _env.from_string(text).render(v),
            lambda expr, v: _env.compile_expression(expr)(v), self.fleet.contexts)
        return self.services

    def mc(self, host: str, check: bool = False, diff: bool = True) -> ModuleContext:
        session = self.fleet.contexts[host]
        variables = {**session.vars, "inventory_hostname": host, **self.extra_vars}
        return ModuleContext(session, variables, check, diff, self.base_dir, self.services)

    def __call__(self, name: str, host: str, raw: dict[str, Any], check: bool = False) -> TaskResult:
        mod = MODULES[name]
        result: TaskResult = mod.fn(self.mc(host, check), mod.args.model_validate(raw))
        return result


@pytest.fixture(scope="module")
def lab(sglang_lab: LabHandle) -> Iterator[LabHandle]:
    for host in sglang_lab.hosts:
        sglang_lab.ssh(host, f"rm -rf {ROOT} && mkdir -p {ROOT}")
    yield sglang_lab
    for host in sglang_lab.hosts:
        sglang_lab.ssh(host, f"rm -rf {ROOT}")


@pytest.fixture(scope="module")
def fleet(lab: LabHandle) -> Iterator[Fleet]:
    """One fleet for the module's tests (agents started once), over an inventory copy with a secret
    variable and the GPU/triton stand-in vars of the kernels tests."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["all"]["vars"] = {"secret_vars": ["hf_token"], "hf_token": SECRET}
    hosts = doc["all"]["children"]["lab"]["hosts"]
    for name, extra in HOST_VARS.items():
        hosts[name].update(extra)
    # A host nothing listens for: a baseline or overlay source that cannot be reached.
    ghost = {**hosts["lab1"], "ansible_host": lab.base_address.rsplit(".", 1)[0] + ".250"}
    doc["all"]["children"]["ghosts"] = {"hosts": {"ghost": ghost}}
    path = lab.dir / "inventory-playbook-modules.yml"
    path.write_text(yaml.safe_dump(doc))
    inv = load_inventory(path)
    with Fleet(inv, inv.select("lab"), RunSettings(forks=8, command_timeout=300)) as f:
        yield f
    path.unlink(missing_ok=True)


@pytest.fixture
def run(fleet: Fleet, tmp_path: Path) -> Runner:
    return Runner(fleet, tmp_path)


def host_file(lab: LabHandle, host: str, path: str) -> tuple[str, str]:
    """(sha256, octal mode) of a host file, or ("", "") when it is not there."""
    q = shlex.quote(path)
    out = lab.ssh(host, f"test -e {q} && sha256sum {q} | cut -d' ' -f1 && stat -c %a {q}; true").stdout.split()
    return (out[0], out[1]) if out else ("", "")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- copy / template -----------------------------------------------------------------------------

def test_copy_writes_with_mode_is_idempotent_and_check_mode_changes_nothing(
    lab: LabHandle, run: Runner, tmp_path: Path
) -> None:
    dest = f"{ROOT}/app.conf"
    first = run("copy", "lab1", {"dest": dest, "content": "a = 1\nb = 2\n", "mode": "0640"})
    assert (first.changed, first.failed, first.data["created"]) == (True, False, True)
    assert host_file(lab, "lab1", dest) == (sha(b"a = 1\nb = 2\n"), "640")
    assert lab.ssh("lab1", f"ls -a {ROOT}").stdout.split() == [".", "..", "app.conf"]  # no temp file left
    again = run("copy", "lab1", {"dest": dest, "content": "a = 1\nb = 2\n", "mode": "0640"})
    assert (again.changed, again.msg) == (False, f"{dest} unchanged")

    before = lab.ssh("lab1", f"stat -c '%i %Y' {dest} && cat {dest}").stdout
    planned = run("copy", "lab1", {"dest": dest, "content": "a = 1\nb = 3\n"}, check=True)
    assert planned.changed and planned.msg.startswith("would update")
    assert "-b = 2\n+b = 3\n" in planned.diff and f"--- a{dest}" in planned.diff
    assert lab.ssh("lab1", f"stat -c '%i %Y' {dest} && cat {dest}").stdout == before  # byte-identical, same inode

    # without mode: the file keeps its own; a mode alone is a change too
    kept = run("copy", "lab1", {"dest": dest, "content": "a = 1\nb = 3\n"})
    assert kept.changed and host_file(lab, "lab1", dest) == (sha(b"a = 1\nb = 3\n"), "640")
    chmod = run("copy", "lab1", {"dest": dest, "content": "a = 1\nb = 3\n", "mode": "0644"})
    assert chmod.changed and chmod.diff == "mode: 0640 -> 0644\n" and host_file(lab, "lab1", dest)[1] == "644"

    # src: a controller file relative to the playbook's folder, binary bytes as they are
    blob = bytes(range(256)) * 40
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "blob.bin").write_bytes(blob)
    copied = run("copy", "lab2", {"dest": f"{ROOT}/blob.bin", "src": "files/blob.bin"})
    assert copied.changed and host_file(lab, "lab2", f"{ROOT}/blob.bin") == (sha(blob), "644")
    assert "binary" in copied.diff


def test_copy_refuses_a_missing_parent_folder_and_writes_nothing(lab: LabHandle, run: Runner) -> None:
    for check in (True, False):
        with pytest.raises(HostError) as err:
            run("copy", "lab3", {"dest": f"{ROOT}/nope/app.conf", "content": "x\n"}, check=check)
        assert err.value.host == "lab3"
        assert err.value.reason == f"{ROOT}/nope/app.conf: parent folder {ROOT}/nope does not exist (create it first)"
    assert lab.ssh("lab3", f"test -e {ROOT}/nope", check=False).returncode == 1


def test_template_masks_the_secret_and_writes_0600(lab: LabHandle, run: Runner, tmp_path: Path) -> None:
    dest = f"{ROOT}/service.env"
    (tmp_path / "service.env.j2").write_text("LISTEN={{ service_host }}\nHF_TOKEN={{ hf_token }}\n")
    planned = run("template", "lab2", {"src": "service.env.j2", "dest": dest}, check=True)
    assert planned.changed and planned.data["secret"] is True and planned.data["mode"] == "0600"
    assert f"+HF_TOKEN={MASK}\n" in planned.diff and SECRET not in planned.diff + planned.msg
    assert f"+LISTEN={lab.addresses['lab2']}\n" in planned.diff
    assert host_file(lab, "lab2", dest) == ("", "")  # check mode wrote nothing

    done = run("template", "lab2", {"src": "service.env.j2", "dest": dest})
    assert done.changed and SECRET not in done.diff + done.msg + json.dumps(done.data)
    assert "sha256" not in done.data  # not even a hash of it
    text = f"LISTEN={lab.addresses['lab2']}\nHF_TOKEN={SECRET}\n".encode()
    assert host_file(lab, "lab2", dest) == (sha(text), "600")
    assert not run("template", "lab2", {"src": "service.env.j2", "dest": dest}).changed

    run.new_run(hf_token="hf_rotatedSECRET")  # the secret rotated: the diff can only say so
    rotated = run("template", "lab2", {"src": "service.env.j2", "dest": dest}, check=True)
    assert rotated.changed and "content differs only in secret values (masked)" in rotated.diff
    assert "SECRET" not in rotated.diff.replace(MASK, "")

    (tmp_path / "bad.j2").write_text("ok\n{{ no_such_var }}\n")
    with pytest.raises(InputError, match=r"bad\.j2:2: UndefinedError: 'no_such_var' is undefined"):
        run("template", "lab2", {"src": "bad.j2", "dest": f"{ROOT}/bad"})


# --- probe -----------------------------------------------------------------------------------------

def test_probe_symbol_expectation_per_host(lab: LabHandle, run: Runner) -> None:
    args = {"symbol": "SpeculativeAlgorithm.DFLASH", "venv": ML_VENV, "expect": "present"}
    new = run("probe", "lab1", args, check=True)  # read-only: the same in check mode
    assert (new.failed, new.changed, new.data["present"]) == (False, False, True)
    assert new.data["definitions"][0]["path"].startswith("sglang/srt/")
    old = run("probe", "lab2", args)
    assert old.failed and old.data["present"] is False
    assert old.msg.startswith("expected a definition of SpeculativeAlgorithm.DFLASH present on lab2, it is not")
    assert not run("probe", "lab2", {**args, "expect": "absent"}).failed


def test_probe_import_grep_http_script(lab: LabHandle, run: Runner, tmp_path: Path) -> None:
    # --no-deps venvs: sglang/__init__ needs numpy, so the import fails, naming why and the owner
    imp = run("probe", "lab2", {"import": "sglang.version", "venv": ML_VENV, "expect": "present"})
    assert imp.failed and (imp.data["dist"], imp.data["dist_version"]) == ("sglang", OLD_SGLANG)
    assert imp.msg.endswith("NOT imported sglang.version: ModuleNotFoundError: No module named 'numpy'")
    std = run("probe", "lab2", {"import": "importlib.metadata:packages_distributions", "venv": ML_VENV,
                                "expect": "present"})
    assert not std.failed and std.data["attr_found"] is True
    grep = run("probe", "lab3", {"grep": ["class SpeculativeAlgorithm", "NO_SUCH_TEXT_ANYWHERE"], "venv": ML_VENV,
                                 "subpath": "srt", "expect": "present"})
    assert grep.failed and grep.data["counts"]["NO_SUCH_TEXT_ANYWHERE"] == 0
    assert grep.data["counts"]["class SpeculativeAlgorithm"] >= 1
    absent = run("probe", "lab3", {"grep": "NO_SUCH_TEXT_ANYWHERE", "venv": ML_VENV, "expect": "absent"})
    assert not absent.failed and absent.data["absent"] is True
    fresh = run("probe", "lab3", {"grep": "NO_SUCH_TEXT_ANYWHERE", "venv": ML_VENV, "cache": False})
    assert fresh.data["cached_files"] == 0 and fresh.data["counts"] == absent.data["counts"]
    http = run("probe", "lab1", {"http": "/health", "port": 1, "status": 200, "timeout": 2})
    assert http.failed and http.msg == "expected /health to answer 200, got refused"
    (tmp_path / "probe.py").write_text("import json, os, sys\n"
                                       "print(json.dumps({'args': json.loads(os.environ['FLEETCTL_ARGS']),"
                                       " 'py': sys.version_info[0]}))\n")
    script = run("probe", "lab1", {"script": "probe.py", "args": {"device": "NVIDIA_H200"}, "venv": ML_VENV})
    assert not script.failed and script.data["json"] == {"args": {"device": "NVIDIA_H200"}, "py": 3}


# --- drift -----------------------------------------------------------------------------------------

def test_drift_against_a_baseline_host_and_a_lock(lab: LabHandle, run: Runner, tmp_path: Path) -> None:
    args = {"baseline": "lab1", "venv": ML_VENV, "skip": ["unsatisfied"]}  # venvs installed --no-deps
    old = run("drift", "lab2", args, check=True)
    assert old.failed and not old.changed and old.data["drift"] is True
    (finding,) = [f for f in old.data["findings"] if f["kind"] == "version"]
    assert (finding["package"], finding["expected"], finding["actual"]) == ("sglang", NEW_SGLANG, OLD_SGLANG)
    assert old.msg == f"1 findings vs host lab1: sglang {OLD_SGLANG}, baseline {NEW_SGLANG}"
    same = run("drift", "lab3", args)
    assert (same.failed, same.msg, same.data["findings"]) == (False, "no drift from host lab1", [])
    baselines = [k for k in run.services.memo if "drift-baseline" in str(k)]
    assert len(baselines) == 1  # lab1 was asked once for both hosts
    assert not run("drift", "lab1", {**args, "verify_files": True}).failed  # the baseline against itself

    # an unreachable baseline fails this host naming it; this host is not "unreachable" itself
    with pytest.raises(HostError) as err:
        run("drift", "lab2", {**args, "baseline": "ghost"})
    assert type(err.value) is HostError and err.value.host == "lab2"
    assert err.value.reason.startswith("baseline ghost is unreachable: cannot connect to ")

    (tmp_path / "fleet.lock").write_text(f"sglang=={NEW_SGLANG}\n")
    by_lock = {h: run("drift", h, {"lock": "fleet.lock", "venv": ML_VENV, "skip": ["unsatisfied"]})
               for h in ("lab2", "lab3")}
    assert by_lock["lab2"].failed and not by_lock["lab3"].failed
    assert by_lock["lab3"].data["baseline"] == "lock fleet.lock"


# --- kernels ---------------------------------------------------------------------------------------

def test_kernels_plan_data_and_strict(run: Runner, tmp_path: Path) -> None:
    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 3}
    folder = tmp_path / "files" / "kernels" / "triton_3_4_0"
    folder.mkdir(parents=True)
    (folder / TUNED).write_text(json.dumps({"1": entry}))
    lab1 = run("kernels", "lab1", {"venv": ML_VENV, "strict": True}, check=True)
    assert not lab1.failed and not lab1.changed
    assert lab1.data["selected"] == [f"triton_3_4_0/{TUNED}"] and lab1.data["warnings"] == []
    assert [(e["filename"], e["status"]) for e in lab1.data["entries"]] == [(TUNED, "exact")]
    assert lab1.data["facts"]["sglang_version"] == NEW_SGLANG
    lab3 = run("kernels", "lab3", {"venv": ML_VENV, "strict": True})
    assert lab3.failed and "no triton_3_5_0 folder at all" in lab3.msg
    assert [e["status"] for e in lab3.data["entries"]] == ["fallback"]
    assert not run("kernels", "lab3", {"venv": ML_VENV}).failed  # warnings alone do not fail


# --- venv ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def idna_lock(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lock and a wheelhouse holding one small real wheel (idna)."""
    folder = tmp_path_factory.mktemp("venv-lock")
    (folder / "wheels").mkdir()
    idna = next(w for w in wheel_set(REQUESTS) if w.name.startswith("idna-"))
    (folder / "wheels" / idna.name).write_bytes(idna.read_bytes())
    (folder / "idna.lock").write_text(f"idna=={idna.name.split('-')[1]}\n")
    return folder


def test_venv_present_plans_then_creates_then_nothing_to_change(lab: LabHandle, fleet: Fleet,
                                                                idna_lock: Path) -> None:
    venv = "/root/pb-venv"
    lab.ssh("lab3", f"rm -rf {venv}")
    run = Runner(fleet, idna_lock)
    args = {"venv": venv, "lock": "idna.lock", "wheelhouse": "wheels", "python": "3.11"}
    planned = run("venv", "lab3", args, check=True)
    assert planned.changed and planned.msg == "would: venv created, 1 installed"
    assert planned.diff.startswith(f"create {venv} (pip)\n+ idna==")
    assert lab.ssh("lab3", f"test -e {venv}", check=False).returncode == 1  # check mode created nothing
    done = run("venv", "lab3", args)
    assert done.changed and done.data["installed"] == [planned.data["installed"][0]]
    ran = lab.ssh("lab3", f"{venv}/bin/python -c 'import idna; print(idna.__version__)'")
    assert planned.data["installed"][0] == f"idna=={ran.stdout.strip()}"
    again = run("venv", "lab3", args)
    assert (again.changed, again.msg, again.data["uploaded"]) == (False, "nothing to change", 0)


def test_venv_overlay_plans_applies_and_is_idempotent(lab: LabHandle, fleet: Fleet, tmp_path: Path) -> None:
    src, dst = "/root/pb-ov-src", "/root/pb-ov-dst"
    make_venv(lab, "lab1", src, [w for w in wheel_set(REQUESTS) if w.name.startswith(("idna-", "certifi-"))])
    lab.ssh("lab2", f"rm -rf {dst} && /usr/bin/python3 -m venv {dst}")
    run = Runner(fleet, tmp_path)
    args = {"state": "overlay", "from": "lab1", "venv": src, "to_venv": dst, "packages": ["idna", "certifi"]}
    site = f"{dst}/lib/python3.11/site-packages"
    planned = run("venv", "lab2", args, check=True)
    assert planned.changed and planned.msg == "would change 2 distributions"
    assert {d["name"]: d["action"] for d in planned.data["dists"]} == {"certifi": "add", "idna": "add"}
    assert "add idna - -> " in planned.diff
    assert lab.ssh("lab2", f"ls {site} | grep -c idna", check=False).stdout.strip() == "0"
    done = run("venv", "lab2", args)
    assert done.changed and done.data["applied"]["written"] > 10
    assert lab.ssh("lab2", f"{dst}/bin/python -c 'import idna, certifi'", check=False).returncode == 0
    again = run("venv", "lab2", args)
    assert (again.changed, again.msg) == (False, "nothing to change")
    source = run("venv", "lab1", {**args, "to_venv": src})
    assert source.skipped and source.msg == "lab1 is the overlay source"
    with pytest.raises(HostError, match=r"^lab2: overlay source ghost is unreachable: cannot connect to "):
        run("venv", "lab2", {**args, "from": "ghost"})
