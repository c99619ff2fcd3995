"""End to end on the lab fleet (real sshd, real sglang wheels): probe import, http, script.

The lab venvs hold sglang installed with --no-deps, so importing any sglang module fails the way
it does on a half-built host (no numpy, no torch): the probe must still name the file, the owning
distribution and its version per host, and show the error verbatim.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import CliRun, run_cli
from lab_support import LabHandle
from sglang_support import LAYOUT, ML_VENV, generate

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parent.parent
FAKE_SGLANG = REPO / "fleetctl" / "lab" / "fake_sglang.py"
EXAMPLES = REPO / "examples" / "probes"
SITE = f"{ML_VENV}/lib/python3.11/site-packages"
BADEXT_C = """\
#include <Python.h>
extern int fleetctl_missing_symbol(void);
static PyObject *f(PyObject *self, PyObject *args) { return PyLong_FromLong(fleetctl_missing_symbol()); }
static PyMethodDef methods[] = {{"f", f, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "fleetprobe_badext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_fleetprobe_badext(void) { return PyModule_Create(&def); }
"""


@pytest.fixture
def lab_inventory(sglang_lab: LabHandle) -> Iterator[Callable[[dict[str, dict[str, Any]]], str]]:
    """A copy of the lab inventory with extra host vars, beside the original (its key and
    known_hosts are found relative to it); removed afterwards."""
    made: list[Path] = []

    def write(host_vars: dict[str, dict[str, Any]]) -> str:
        doc = yaml.safe_load(sglang_lab.inventory_path.read_text())
        for name, extra in host_vars.items():
            doc["all"]["children"]["lab"]["hosts"][name].update(extra)
        path = sglang_lab.dir / f"inventory-probe-runtime-{os.getpid()}-{len(made)}.yml"
        path.write_text(yaml.safe_dump(doc))
        made.append(path)
        return str(path)

    yield write
    for path in made:
        path.unlink(missing_ok=True)


def probe(capsys: pytest.CaptureFixture[str], inventory: str, *args: str, limit: str | None = None) -> CliRun:
    return run_cli(capsys, "-i", inventory, *(["-l", limit] if limit else []), "probe", *args)


def flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines on a narrow console


# -- import ---------------------------------------------------------------------------------

def test_import_sglang_version_names_owner_and_version_per_host(
        sglang_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = probe(capsys, str(sglang_lab.inventory_path), "import", "sglang.version", "--venv", ML_VENV, "--json")
    assert r.rc == 0, r.err
    for host, version in LAYOUT.items():
        value = r.json()["hosts"][host]["value"]
        assert (value["dist"], value["dist_version"]) == ("sglang", version)
        assert value["file"] == f"{SITE}/sglang/version.py"
        assert value["owners"][0]["owns_file"] is True
        assert value["python"] == f"{ML_VENV}/bin/python"
        # --no-deps venvs: sglang/__init__ needs numpy, exactly as a half-built host fails
        assert (value["imported"], value["error_type"], value["error"]) == (
            False, "ModuleNotFoundError", "No module named 'numpy'")
    human = probe(capsys, str(sglang_lab.inventory_path), "import", "sglang.version", "--venv", ML_VENV)
    assert "owner   sglang 0.5.23" in human.out and "owner   sglang 0.5.9" in human.out
    assert "lab1,lab3 (2)" in human.out
    assert "NOT imported: ModuleNotFoundError: No module named 'numpy'" in human.out


def test_import_spec_info_attr_and_expectations(sglang_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    inv = str(sglang_lab.inventory_path)
    target = "sglang.srt.speculative.spec_info:SpeculativeAlgorithm.DFLASH"
    r = probe(capsys, inv, "import", target, "--venv", ML_VENV, "--expect", "present", "--json")
    assert r.rc == 1  # it cannot import without torch/numpy: not present anywhere
    assert "but not on: lab1, lab2, lab3" in flat(r.err)
    lab1 = r.json()["hosts"]["lab1"]["value"]
    assert lab1["file"] == f"{SITE}/sglang/srt/speculative/spec_info.py"  # located without running it
    assert (lab1["error_type"], lab1["error"], lab1["attr_found"]) == (
        "ModuleNotFoundError", "No module named 'numpy'", None)
    assert r.json()["hosts"]["lab2"]["value"]["dist_version"] == "0.5.9"
    # an attribute of a module that imports cleanly in the same venvs
    ok = probe(capsys, inv, "import", "importlib.metadata:packages_distributions", "--venv", ML_VENV,
               "--expect", "present", "--json")
    assert ok.rc == 0, ok.err
    assert {h["value"]["attr_type"] for h in ok.json()["hosts"].values()} == {"function"}
    absent = probe(capsys, inv, "import", "json:JSONDecodeError.no_such", "--venv", ML_VENV, "--expect", "absent")
    assert absent.rc == 0
    assert "attr    JSONDecodeError.no_such: absent (json.JSONDecodeError has no attribute 'no_such')" in absent.out


def test_import_with_missing_venv_fails_that_host_only(
        sglang_lab: LabHandle, lab_inventory: Callable[..., str], capsys: pytest.CaptureFixture[str]) -> None:
    inv = lab_inventory({"lab1": {"venv": ML_VENV}, "lab2": {"venv": "/root/no-such-venv"}, "lab3": {"venv": ML_VENV}})
    r = probe(capsys, inv, "import", "sglang.version", "--json")
    assert r.rc == 2
    hosts = r.json()["hosts"]
    assert hosts["lab2"]["status"] == "failed"
    assert hosts["lab2"]["reason"] == "venv /root/no-such-venv not found: no python at /root/no-such-venv/bin/python"
    assert hosts["lab1"]["value"]["dist_version"] == hosts["lab3"]["value"]["dist_version"] == "0.5.23"


def test_undefined_symbol_on_a_lab_host(sglang_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    """A compiled extension built on the host against its python, referencing a missing symbol."""
    venv = "/root/fleetctl-probe-ext-venv"
    source = sglang_lab.dir / f"badext-{os.getpid()}.c"
    source.write_text(BADEXT_C)
    build = (
        f"set -e; rm -rf {venv}; /usr/bin/python3 -m venv --without-pip {venv}; "
        f"site=$({venv}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); "
        f"inc=$({venv}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"include\"])'); "
        f"ext=$({venv}/bin/python -c 'import sysconfig; print(sysconfig.get_config_var(\"EXT_SUFFIX\"))'); "
        f"command -v gcc >/dev/null && test -f $inc/Python.h || exit 42; "
        f"gcc -shared -fPIC -I$inc {shlex.quote(str(source))} -o $site/fleetprobe_badext$ext; "
        "echo $site/fleetprobe_badext$ext"
    )
    try:
        built = sglang_lab.ssh("lab1", build, check=False)
        assert built.returncode != 42, "no gcc or Python.h on the lab host (make deps installs them)"
        assert built.returncode == 0, built.stderr
        so = built.stdout.strip()
        r = probe(capsys, str(sglang_lab.inventory_path), "import", "fleetprobe_badext",
                  "--venv", venv, "--json", limit="lab1")
        assert r.rc == 0, r.err
        value = r.json()["hosts"]["lab1"]["value"]
        assert (value["imported"], value["error_type"]) == (False, "ImportError")
        assert value["error"] == f"{so}: undefined symbol: fleetctl_missing_symbol"
        human = probe(capsys, str(sglang_lab.inventory_path), "import", "fleetprobe_badext",
                      "--venv", venv, limit="lab1")
        assert f"NOT imported: ImportError: {so}: undefined symbol: fleetctl_missing_symbol" in human.out
    finally:
        sglang_lab.ssh("lab1", f"rm -rf {venv}", check=False)
        source.unlink(missing_ok=True)


# -- http -----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(address: str, port: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"fake_sglang did not listen on {port}")


@pytest.fixture
def fake_services(sglang_lab: LabHandle) -> Iterator[Callable[[str, list[str]], int]]:
    """Start fake_sglang on a lab host over real ssh; each gets its own port (the lab hosts share
    this machine's network). Stopped by pid afterwards (the lab has no pid namespace)."""
    script = sglang_lab.dir / f"fake_sglang-{os.getpid()}.py"  # lab hosts see the lab folder, not /root
    script.write_bytes(FAKE_SGLANG.read_bytes())
    api = FAKE_SGLANG.with_name("fake_sglang_api.py")  # imported by the stand-in from beside it
    (sglang_lab.dir / api.name).write_bytes(api.read_bytes())
    pids: list[int] = []

    def start(host: str, args: list[str]) -> int:
        port = free_port()
        address = sglang_lab.addresses[host]  # the lab inventory's service_host for that host
        argv = " ".join(shlex.quote(a) for a in ["/usr/bin/python3", str(script), "--host", address,
                                                   "--port", str(port), *args])
        out = sglang_lab.ssh(host, f"nohup {argv} </dev/null >/dev/null 2>&1 & echo $!").stdout
        pids.append(int(out.strip()))
        wait_listening(address, port)
        return port

    yield start
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    script.unlink(missing_ok=True)


@pytest.fixture
def service_inventory(fake_services: Callable[[str, list[str]], int], sglang_lab: LabHandle,
                      lab_inventory: Callable[..., str]) -> str:
    ports = {
        "lab1": fake_services("lab1", ["--spec-algorithm", "DDTREE", "--accept-length", "3.2"]),
        "lab2": fake_services("lab2", ["--old-api", "--version", "0.5.9", "--spec-algorithm", "DFLASH",
                                       "--accept-length", "2.1"]),
        "lab3": fake_services("lab3", ["--health-status", "503"]),
    }
    # SGLang reports an acceptance length only once it has served: one generation each
    generate(ports["lab1"], 32, host=sglang_lab.addresses["lab1"])
    generate(ports["lab2"], 21, host=sglang_lab.addresses["lab2"])
    return lab_inventory({h: {"service_port": p, "venv": ML_VENV} for h, p in ports.items()})


def test_http_fields_fallback_and_latency(service_inventory: str, sglang_lab: LabHandle,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    r = probe(capsys, service_inventory, "http", "/server_info", "--field", "version",
              "--field", "internal_states.0.avg_spec_accept_length", "--json")
    assert r.rc == 0, r.err
    hosts = {h: e["value"] for h, e in r.json()["hosts"].items()}
    assert hosts["lab1"]["fields"] == {"version": "0.5.23", "internal_states.0.avg_spec_accept_length": 3.2}
    assert (hosts["lab1"]["path"], hosts["lab1"]["fell_back"]) == ("/server_info", False)
    assert hosts["lab2"]["fields"] == {"version": "0.5.9", "internal_states.0.avg_spec_accept_length": 2.1}
    assert (hosts["lab2"]["path"], hosts["lab2"]["fell_back"]) == ("/get_server_info", True)
    assert hosts["lab3"]["missing_fields"] == ["internal_states.0.avg_spec_accept_length"]  # no speculation
    for name, value in hosts.items():
        assert value["status"] == 200 and 0 < value["latency_ms"] < 5000
        assert value["url"].startswith(f"http://{sglang_lab.addresses[name]}:")  # each host's own address
    human = probe(capsys, service_inventory, "http", "/server_info", "--field", "version")
    assert "/get_server_info (fallback)" in human.out and "lab2: 0.5.9" in human.out


def test_http_expect_status_names_the_sick_host(service_inventory: str, capsys: pytest.CaptureFixture[str]) -> None:
    r = probe(capsys, service_inventory, "http", "/health", "--expect-status", "200")
    assert r.rc == 1
    assert "expected /health to answer 200, but not on: lab3 (503)" in flat(r.err)
    healthy = probe(capsys, service_inventory, "http", "/health", "--expect-status", "200", limit="lab1,lab2")
    assert healthy.rc == 0, healthy.err
    refused = probe(capsys, service_inventory, "http", "/health", "--port", str(free_port()),
                    "--expect-status", "200", "--json", limit="lab1")
    assert refused.rc == 1
    assert refused.json()["hosts"]["lab1"]["value"]["error_kind"] == "refused"


# -- script ---------------------------------------------------------------------------------

def sglang_lab_address(inventory: str, host: str) -> str:
    return str(yaml.safe_load(Path(inventory).read_text())["all"]["children"]["lab"]["hosts"][host]["service_host"])


def test_example_spec_accept_len(service_inventory: str, capsys: pytest.CaptureFixture[str]) -> None:
    ports = {h: v["service_port"] for h, v in yaml.safe_load(Path(service_inventory).read_text())
             ["all"]["children"]["lab"]["hosts"].items()}
    want = {"lab1": (3.2, "/server_info"), "lab2": (2.1, "/get_server_info")}
    for host, (length, endpoint) in want.items():
        r = probe(capsys, service_inventory, "script", str(EXAMPLES / "spec_accept_len.py"),
                  "--arg", f"port={ports[host]}", "--arg", f"host={sglang_lab_address(service_inventory, host)}",
                  "--json", limit=host)
        assert r.rc == 0, r.err
        doc = r.json()["hosts"][host]["value"]["json"]
        assert (doc["avg_spec_accept_length"], doc["endpoint"]) == (length, endpoint)


def test_example_moe_configs_per_sglang_release(sglang_lab: LabHandle, capsys: pytest.CaptureFixture[str]) -> None:
    r = probe(capsys, str(sglang_lab.inventory_path), "script", str(EXAMPLES / "moe_configs.py"),
              "--venv", ML_VENV, "--arg", "device=NVIDIA_H200", "--json")
    assert r.rc == 0, r.err
    docs = {h: e["value"]["json"] for h, e in r.json()["hosts"].items()}
    assert docs["lab1"]["source"] == "sglang/srt/layers/moe/moe_runner/triton_utils/configs"
    assert docs["lab2"]["source"] == "sglang/srt/layers/moe/fused_moe_triton/configs"  # 0.5.9's layout
    assert (docs["lab1"]["sglang"], docs["lab2"]["sglang"]) == ("0.5.23", "0.5.9")
    for doc in docs.values():
        names = [n for files in doc["folders"].values() for n in files]
        assert names and all(",device_name=NVIDIA_H200" in n for n in names)
        assert doc["count"] == len(names) and doc["triton"] is None
    human = probe(capsys, str(sglang_lab.inventory_path), "script", str(EXAMPLES / "moe_configs.py"),
                  "--venv", ML_VENV, "--arg", "device=NVIDIA_H200")
    assert "lab1,lab3 (2)" in human.out and "lab2 (1)" in human.out


def test_scripts_that_raise_print_text_and_read_args(sglang_lab: LabHandle, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    inv = str(sglang_lab.inventory_path)
    boom = tmp_path / "boom.py"
    boom.write_text("import socket\nif socket.gethostname() != 'lab2':\n    raise RuntimeError('no GPU here')\n"
                    "print('fine')\n")
    r = probe(capsys, inv, "script", str(boom))
    assert r.rc == 2
    assert "lab1,lab3 (2) [failed, rc=1]" in r.out
    assert f'File "{boom}", line 3, in <module>' in r.out  # the local file, not the host's temp copy
    assert "RuntimeError: no GPU here" in r.out and "lab2 (1)" in r.out
    doc = probe(capsys, inv, "script", str(boom), "--json").json()["hosts"]
    assert doc["lab1"]["reason"] == "exited 1: RuntimeError: no GPU here"
    assert doc["lab2"]["value"]["text"] == "fine\n"
    echo = tmp_path / "echo.py"
    echo.write_text("import json, os, socket, sys\nprint(json.dumps({'host': socket.gethostname(), "
                    "'args': json.loads(os.environ['FLEETCTL_ARGS']), 'argv': sys.argv[1:], 'exe': sys.executable}))\n")
    r = probe(capsys, inv, "script", str(echo), "--venv", ML_VENV, "--arg", "device=NVIDIA_H200",
              "--arg", "note=a b", "--json")
    assert r.rc == 0, r.err
    for host, entry in r.json()["hosts"].items():
        assert entry["value"]["json"] == {"host": host, "args": {"device": "NVIDIA_H200", "note": "a b"},
                                          "argv": ["device=NVIDIA_H200", "note=a b"], "exe": f"{ML_VENV}/bin/python"}


def test_script_timeout_on_lab_host(sglang_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slow = tmp_path / "slow.py"
    slow.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    start = time.monotonic()
    r = probe(capsys, str(sglang_lab.inventory_path), "script", str(slow), "--timeout", "2", "--json", limit="lab1")
    assert time.monotonic() - start < 30
    assert r.rc == 2
    entry = r.json()["hosts"]["lab1"]
    assert entry["reason"] == "timed out after 2s (killed)"
    assert entry["value"]["timed_out"] is True and entry["value"]["text"] == "started\n"
