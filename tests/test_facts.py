"""Host facts: the host-side scripts run for real (in-process and as a py3 child), a throwaway venv
with real pip-installed wheels, and parse_facts on the answers captured on a real H200 machine."""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from interpreters import NO_PY38, find_python
from remote_support import remote_module

from fleetctl.errors import AgentError, RemoteOperationError
from fleetctl.facts import HostFacts, collect_facts, facts_table_rows, parse_facts
from fleetctl.gpu.smi import describe_gpus
from fleetctl.transport.agent import module_source
from fleetctl.transport.base import CommandResult

REMOTE = Path(__file__).resolve().parent.parent / "fleetctl" / "remote"
FIXTURES = Path(__file__).parent / "fixtures"
SYSTEM_PYTHON = "/usr/bin/python3"
needs_system_python = pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="no /usr/bin/python3")
# The oldest Python the host-side scripts promise to run on, where this machine has one.
PY38 = find_python("3.8")
CHILD_PYTHONS = [
    pytest.param(SYSTEM_PYTHON, id="system-python3", marks=needs_system_python),
    pytest.param(PY38, id="python3.8", marks=pytest.mark.skipif(PY38 is None, reason=NO_PY38)),
]
BUILTIN_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}


@pytest.fixture(autouse=True)
def _plain_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # pyenv shims on PATH are shell wrappers costing ~150 ms each to ask for a version: keep them out.
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")


def load_remote(name: str) -> ModuleType:
    return remote_module(name)  # with its includes, as the agent ships it


def run_child(python: str, name: str, params: dict[str, Any], cwd: Path) -> Any:
    """Run a remote module the way the agent's child mode does: source on stdin, JSON back."""
    src = module_source(name)[0]
    src += f"\n\nimport json as _j\nprint(_j.dumps(main(_j.loads({json.dumps(params)!r}))))\n"
    proc = subprocess.run([python, "-"], input=src, capture_output=True, text=True, timeout=120, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# --- the host-side scripts are stdlib-only Python 3.8 ---------------------------------------------

@pytest.mark.parametrize("name", ["facts", "venv_packages"])
def test_remote_source_is_py38_and_stdlib_only(name: str) -> None:
    tree = ast.parse((REMOTE / f"{name}.py").read_text(), feature_version=(3, 8))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, "no relative imports: the source is shipped alone"
            roots = [node.module.split(".")[0]]
        else:
            roots = []
        assert all(r in sys.stdlib_module_names for r in roots), roots
        annotations = [getattr(node, "returns", None), getattr(node, "annotation", None)]
        for ann in filter(None, annotations):  # list[str] / X | Y annotations fail at runtime on 3.8
            for sub in ast.walk(ann):
                assert not isinstance(sub, ast.BinOp)
                assert not (isinstance(sub, ast.Subscript) and getattr(sub.value, "id", "") in BUILTIN_GENERICS)


# --- facts.main for real -----------------------------------------------------------------------------

def test_facts_main_in_process(tmp_path: Path) -> None:
    facts = load_remote("facts")
    answer = facts.main({"disk_paths": ["/", str(tmp_path / "nope")]})
    json.dumps(answer)  # JSON-able
    assert answer["hostname"] == socket.gethostname()
    assert answer["interpreter"]["executable"] == sys.executable
    assert answer["memory"]["total"] > answer["memory"]["available"] > 0
    assert answer["cpus"]["count"] == os.cpu_count() and answer["cpus"]["usable"] >= 1
    assert answer["disks"]["/"]["total"] >= answer["disks"]["/"]["free"] > 0
    assert answer["disks"][str(tmp_path / "nope")] is None
    if os.path.exists(SYSTEM_PYTHON):
        system = [p for p in answer["pythons"] if p["path"] == SYSTEM_PYTHON]
        assert system and system[0]["version"].startswith("3.")
    if shutil.which("nvidia-smi") is None and not os.path.exists("/usr/bin/nvidia-smi"):
        assert answer["nvidia_smi"] is None
    assert "venv" not in answer


@pytest.mark.parametrize("python", CHILD_PYTHONS)
def test_facts_main_as_child(python: str, tmp_path: Path) -> None:
    answer = run_child(python, "facts", {}, tmp_path)
    version = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert answer["interpreter"]["version"] == version
    assert set(answer["disks"]) == {"/", "/opt", "/var/lib"}
    parsed = parse_facts(answer, None, None)
    assert parsed.hostname == socket.gethostname() and parsed.memory_total


def _fake_smi(tmp_path: Path, body: str) -> str:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def test_facts_with_a_fake_nvidia_smi_printing_the_h200_capture(tmp_path: Path) -> None:
    h200 = FIXTURES / "nvidia-smi" / "h200-xml"
    smi = _fake_smi(tmp_path, f'echo "$@" >> {tmp_path}/argv\ncase "$1" in\n'
                              f'  -q) cat {h200}/nvidia-smi-q-x.xml ;;\n'
                              f'  nvlink) cat {h200}/nvlink-status.txt ;;\nesac\n')
    answer = load_remote("facts").main({"nvidia_smi": smi})
    # One nvidia-smi -q -x, then nvlink --status (empty: no NVLink, so no `nvlink -e`).
    assert (tmp_path / "argv").read_text().splitlines() == ["-q -x", "nvlink --status"]
    assert answer["nvidia_smi"]["xml"]["argv"][1:] == ["-q", "-x"]
    parsed = parse_facts(answer, None, None)
    assert describe_gpus(parsed.gpus) == "1x NVIDIA H200 (143771 MiB), driver 580.159.04, CUDA 13.0"
    assert parsed.gpu_health is not None and parsed.gpu_health.summary() == "green: 1 GPU, every check green"


def test_facts_with_nvidia_smi_whose_driver_is_not_loaded(tmp_path: Path) -> None:
    stdout = FIXTURES / "nvidia-smi" / "driver-failure" / "stdout.txt"
    smi = _fake_smi(tmp_path, f"cat {stdout}\nexit 9\n")
    answer = load_remote("facts").main({"nvidia_smi": smi})
    assert answer["nvidia_smi"]["xml"]["rc"] == 9  # kept for the controller, not raised
    gpus = parse_facts(answer, None, None).gpus
    assert gpus.gpus == [] and gpus.nvidia_smi == smi
    assert gpus.error == ("nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate with "
                          "the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.")


def test_facts_with_nvidia_smi_that_cannot_execute(tmp_path: Path) -> None:
    broken = tmp_path / "nvidia-smi"
    broken.write_text("not a program")
    broken.chmod(0o644)
    answer = load_remote("facts").main({"nvidia_smi": str(broken)})
    assert answer["nvidia_smi"]["xml"]["rc"] is None
    assert "Permission denied" in parse_facts(answer, None, None).gpus.error  # type: ignore[operator]


# --- venv_packages: pure helpers, in-process, and in a throwaway venv with real wheels -------------

def test_torch_cuda_from_suffix_and_version_py() -> None:
    vp = load_remote("venv_packages")
    assert vp.CUDA_SUFFIX.search("2.9.1+cu128").groups() == ("12", "8")
    assert vp.CUDA_SUFFIX.search("2.11.0+cu130").groups() == ("13", "0")
    assert vp.CUDA_SUFFIX.search("2.9.1+cpu") is None
    assert vp.version_py_field("cuda = '12.8'\n", "cuda") == "12.8"
    assert vp.version_py_field("from typing import Optional\ncuda: Optional[str] = '12.8'\n", "cuda") == "12.8"
    assert vp.version_py_field("cuda: Optional[str] = None\nhip: Optional[str] = '6.2.4'\n", "cuda") is None
    assert vp.version_py_field("cuda: Optional[str] = None\nhip: Optional[str] = '6.2.4'\n", "hip") == "6.2.4"
    real = (FIXTURES / "nvidia-smi" / "h200" / "capture-meta.txt").read_text()  # real torch/version.py
    assert vp.version_py_field(real, "cuda") == "13.0"


def test_venv_packages_in_process() -> None:
    answer = load_remote("venv_packages").main({"packages": ["pytest"]})
    json.dumps(answer)
    assert answer["executable"] == sys.executable and answer["prefix"] == sys.prefix
    assert answer["cache_tag"] == sys.implementation.cache_tag
    assert answer["packages"]["pytest"] == pytest.__version__
    assert set(answer["packages"]) >= {"torch", "triton", "sglang", "sgl-kernel", "sglang-kernel",
                                       "flashinfer", "transformers"}
    assert "torch" not in sys.modules  # versions came from metadata, nothing was imported


@pytest.mark.parametrize("python", CHILD_PYTHONS)
def test_venv_packages_as_child(python: str, tmp_path: Path) -> None:
    answer = run_child(python, "venv_packages", {}, tmp_path)
    assert answer["error"] is None and answer["soabi"]
    assert answer["packages"]["sglang"] is None


def _wheel(dest: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A minimal but valid wheel (METADATA, WHEEL, RECORD with sha256s) for pip to install."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: fleetctl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    wheel = dest / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


@pytest.fixture(scope="module", params=CHILD_PYTHONS)
def ml_venv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real venv with pip-installed wheels: torch whose CUDA is only in torch/version.py (as on
    PyPI), the renamed sglang-kernel next to a stale sgl-kernel dist-info, and a duplicated flashinfer."""
    root = tmp_path_factory.mktemp("venv")
    venv = root / "ml-env"
    python = request.param
    # --without-pip and the outer pip's --python: the same install, without 4 s of ensurepip.
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    wheels = [
        _wheel(root, "torch", "2.9.1", {"torch/__init__.py": "raise ImportError('never import torch')\n",
                                        "torch/version.py": "from typing import Optional\n"
                                                            "__version__ = '2.9.1'\ncuda: Optional[str] = '12.8'\n"}),
        _wheel(root, "sglang-kernel", "0.3.21", {"sgl_kernel/__init__.py": ""}),
        _wheel(root, "flashinfer-python", "0.5.3", {"flashinfer/__init__.py": ""}),
    ]
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", "--disable-pip-version-check", *map(str, wheels)],
                   check=True, timeout=300)
    site = next((venv / "lib").glob("python3*/site-packages"))
    # What an overlay from an older host leaves behind: dist-infos pip did not install.
    for stale, old_name, old_version in [("flashinfer_python-0.4.1", "flashinfer-python", "0.4.1"),
                                         ("sgl_kernel-0.3.16", "sgl-kernel", "0.3.16")]:
        info = site / f"{stale}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {old_name}\nVersion: {old_version}\n")
    return venv


def test_venv_packages_read_from_the_venv(ml_venv: Path, tmp_path: Path) -> None:
    python = str(ml_venv / "bin" / "python")
    answer = run_child(python, "venv_packages", {"packages": ["pytest", "packaging"]}, tmp_path)
    assert answer["executable"] == python and answer["prefix"] == str(ml_venv) and answer["in_venv"]
    packages = answer["packages"]
    assert packages["torch"] == "2.9.1" and packages["sglang-kernel"] == "0.3.21"
    assert packages["sgl-kernel"] == "0.3.16" and packages["sglang"] is None
    assert packages["pytest"] is None and packages["packaging"] is None  # the outer venv's stay outside
    assert answer["torch"] == {"version": "2.9.1", "cuda": "12.8", "hip": None, "source": "torch/version.py"}
    assert answer["dists"]["flashinfer"]["name"] == "flashinfer-python"
    assert sorted(answer["duplicates"]["flashinfer"]) == ["0.4.1", "0.5.3"]
    assert packages["flashinfer"] in ("0.4.1", "0.5.3")


# --- collect_facts through a HostSession ---------------------------------------------------------

class LocalSession:
    """A HostSession that runs the remote modules on this machine, like the agent does."""

    name = "local"

    def __init__(self, tmp: Path, venv_answer: Any = None) -> None:
        self.vars: dict[str, Any] = {}
        self.calls: list[tuple[str, str | None]] = []
        self.tmp = tmp
        self.venv_answer = venv_answer

    def call(self, op: str, params: dict[str, Any] | None = None, *, python: str | None = None,
             timeout: float | None = None) -> Any:
        self.calls.append((op, python))
        if python is None:
            return load_remote(op).main(params or {})
        if isinstance(self.venv_answer, Exception):
            raise self.venv_answer
        return self.venv_answer or run_child(python, op, params or {}, self.tmp)

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        raise NotImplementedError


def test_collect_facts_with_a_venv(ml_venv: Path, tmp_path: Path) -> None:
    session = LocalSession(tmp_path)
    facts = collect_facts(session, str(ml_venv))
    python = str(ml_venv / "bin" / "python")
    assert session.calls == [("facts", None), ("venv_packages", python)]
    assert facts.hostname == socket.gethostname()
    assert facts.venv is not None and facts.venv.error is None
    assert facts.venv.python == python and facts.venv.torch_cuda == "12.8"
    assert facts.venv.abi and facts.venv.abi.startswith("cpython-3")
    rows = dict(facts_table_rows(facts))
    assert rows["torch"] == "2.9.1 (CUDA 12.8)" and rows["sglang"] == "-"
    assert "DUPLICATE dist-info" in rows["flashinfer"]
    json.dumps(facts.to_dict())


class AgentSession:
    """The real agent over a local process, seen through the HostSession interface."""

    name = "local"

    def __init__(self) -> None:
        from fleetctl.transport.agent import AgentClient
        from fleetctl.transport.local import LocalConnector

        self.vars: dict[str, Any] = {}
        self.client = AgentClient("local", LocalConnector("local"), [SYSTEM_PYTHON])
        self.call = self.client.call

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        raise NotImplementedError


@needs_system_python
def test_collect_facts_through_the_real_agent(ml_venv: Path) -> None:
    session = AgentSession()
    try:
        facts = collect_facts(session, str(ml_venv))
        missing = collect_facts(session, "/nonexistent/ml-env")
    finally:
        session.client.close()
    assert facts.hostname == socket.gethostname() and facts.interpreter.path == SYSTEM_PYTHON
    assert facts.venv is not None and facts.venv.error is None
    assert (facts.venv.packages["torch"], facts.venv.torch_cuda) == ("2.9.1", "12.8")
    assert missing.venv is not None and missing.venv.error is not None
    assert missing.venv.error.startswith("no python at /nonexistent/ml-env/bin/python")


def test_collect_facts_missing_venv_is_a_fact_not_a_crash(tmp_path: Path) -> None:
    session = LocalSession(tmp_path)
    facts = collect_facts(session, str(tmp_path / "ml-env"))
    assert session.calls == [("facts", None)]  # venv_packages is not even tried
    assert facts.venv is not None
    assert facts.venv.error == f"no python at {tmp_path}/ml-env/bin/python (no folder {tmp_path}/ml-env)"
    assert dict(facts_table_rows(facts))["venv"].endswith(facts.venv.error)


def test_collect_facts_copied_venv_with_dangling_python(tmp_path: Path) -> None:
    venv = tmp_path / "copied-env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/opt/other-host/bin/python3.12")
    (venv / "pyvenv.cfg").write_text("home = /opt/other-host/bin\nversion = 3.12.3\n")
    session = LocalSession(tmp_path)
    facts = collect_facts(session, str(venv))
    assert facts.venv is not None
    assert facts.venv.error == f"no python at {venv}/bin/python (dangling link to /opt/other-host/bin/python3.12)"
    assert session.calls == [("facts", None)]


def test_collect_facts_venv_python_that_breaks(ml_venv: Path, tmp_path: Path) -> None:
    err = RemoteOperationError("local", "venv_packages", "OSError", "exec format error")
    facts = collect_facts(LocalSession(tmp_path, venv_answer=err), str(ml_venv))
    assert facts.venv is not None and facts.venv.error is not None
    assert "could not run venv_packages" in facts.venv.error and "exec format error" in facts.venv.error


def test_collect_facts_rejects_a_non_object_answer(tmp_path: Path) -> None:
    session = LocalSession(tmp_path)
    session.call = lambda *a, **k: ["not", "a", "dict"]  # type: ignore[method-assign]
    with pytest.raises(AgentError, match="facts answered a list"):
        collect_facts(session, None)


# --- parse_facts on answers captured on a real H200 machine --------------------------------------

def _h200() -> HostFacts:
    raw = json.loads((FIXTURES / "facts" / "h200-facts.json").read_text())
    raw_venv = json.loads((FIXTURES / "facts" / "h200-venv.json").read_text())
    return parse_facts(raw, raw_venv, "/opt/torch/.venv")


def test_parse_facts_h200_capture() -> None:
    facts = _h200()
    assert (facts.hostname, facts.os, facts.arch) == ("vm", "Ubuntu 24.04.3 LTS", "x86_64")
    assert (facts.cpus, facts.cpus_usable, facts.memory_total) == (16, 16, 135128870912)
    assert facts.interpreter.version == "3.12.3" and facts.interpreter.path == "/opt/torch/.venv/bin/python3"
    assert {p.version for p in facts.pythons} == {"3.12.3"}
    gpu = facts.gpus.gpus[0]
    assert (gpu.name, gpu.memory_mib, gpu.compute_capability) == ("NVIDIA H200", 143771, "9.0")
    assert (facts.gpus.driver_version, facts.gpus.cuda_version) == ("580.159.04", "13.0")
    venv = facts.venv
    assert venv is not None and venv.error is None
    assert (venv.python_version, venv.abi, venv.torch_cuda) == ("3.12.3", "cpython-312-x86_64-linux-gnu", "13.0")
    assert venv.packages == {"torch": "2.11.0", "triton": "3.6.0", "sglang": None, "sgl-kernel": None,
                             "sglang-kernel": None, "flashinfer": None, "transformers": "5.17.0"}


def test_h200_summary_rows_and_json() -> None:
    facts = _h200()
    rows = dict(facts_table_rows(facts))
    assert rows["gpus"] == "1x NVIDIA H200 (143771 MiB), driver 580.159.04, CUDA 13.0"
    assert rows["torch"] == "2.11.0 (CUDA 13.0)" and rows["triton"] == "3.6.0" and rows["flashinfer"] == "-"
    assert "sgl-kernel" not in rows  # neither kernel name installed: no noise rows
    assert rows["memory"] == "125.4 GiB available of 125.8 GiB"
    assert rows["os"] == "Ubuntu 24.04.3 LTS, kernel 6.18.44-fc-v973-gpu (x86_64)"
    assert rows["gpu health"] == "green: 1 GPU, every check green"
    doc = json.loads(json.dumps(facts.to_dict()))
    assert doc["gpus"]["gpus"][0]["pci_bus_id"] == "00000000:00:06.0"
    assert doc["gpus"]["gpus"][0]["vbios_version"] == "96.00.A5.00.1A"
    assert doc["gpu_health"]["level"] == "green"
    assert doc["gpu_health"]["gpus"][1]["checks"][2]["rule"] == "row_remapping"


def test_parse_facts_no_gpu_capture() -> None:
    raw = json.loads((FIXTURES / "facts" / "no-gpu-facts.json").read_text())
    facts = parse_facts(raw, None, "/root/ml-env")
    assert facts.gpus.gpus == [] and facts.gpus.error is None
    rows = dict(facts_table_rows(facts))
    assert rows["gpus"] == "no GPU (nvidia-smi not found)"
    assert rows["venv"] == "/root/ml-env: error: no python at /root/ml-env/bin/python (no folder /root/ml-env)"


def test_parse_facts_tolerates_a_sparse_answer() -> None:
    facts = parse_facts({"hostname": "h"}, None, None)
    assert facts.venv is None and facts.disks == {} and facts.gpus.nvidia_smi is None
    assert dict(facts_table_rows(facts))["cpus"] == "? (None usable)"
