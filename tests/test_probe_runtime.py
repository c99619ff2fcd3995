"""Runtime probes on this machine: import, http, script.

Remote modules run in-process or as real children of a local agent (``ansible_connection: local``),
against real things: a throwaway venv with a package, its dist-info and a compiled extension that
references an undefined symbol; a real fake_sglang server process; real scripts.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cli_support import run_cli
from interpreters import NO_PY38, find_python
from sglang_support import generate

from fleetctl.inventory import load_inventory
from fleetctl.probes import http as http_core
from fleetctl.probes import imports as import_core
from fleetctl.probes import script as script_core
from fleetctl.transport.base import HostResult, Status
from fleetctl.transport.fleet import Fleet

REPO = Path(__file__).resolve().parent.parent
REMOTE = REPO / "fleetctl" / "remote"
FAKE_SGLANG = REPO / "fleetctl" / "lab" / "fake_sglang.py"
EXAMPLES = REPO / "examples" / "probes"
SYSTEM_PYTHON = "/usr/bin/python3"
PY38 = find_python("3.8")
DIST_NAME = "fleetprobe-dist"  # the distribution's name differs from its import name, as PyYAML/yaml

SPEC_PY = """\
from enum import Enum, auto


class SpeculativeAlgorithm(Enum):
    EAGLE = auto()
    DFLASH = auto()
"""
BADEXT_C = """\
#include <Python.h>
extern int fleetctl_missing_symbol(void);  /* defined nowhere: the loader must refuse */
static PyObject *f(PyObject *self, PyObject *args) { return PyLong_FromLong(fleetctl_missing_symbol()); }
static PyMethodDef methods[] = {{"f", f, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "fleetprobe_badext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_fleetprobe_badext(void) { return PyModule_Create(&def); }
"""


def load_remote(name: str) -> dict[str, Any]:
    """A remote module's namespace, exactly as the agent builds it."""
    ns: dict[str, Any] = {"__name__": f"fleetctl_remote_{name}"}
    exec(compile((REMOTE / f"{name}.py").read_text(), f"<fleetctl-remote:{name}>", "exec"), ns)
    return ns


# -- a real venv to import from --------------------------------------------------------------

def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    assert found, f"no site-packages in {venv}"
    return found[0]


def _install_fake_dist(site: Path) -> None:
    """fleetprobe_pkg owned by the distribution fleetprobe-dist 1.2.3 (RECORD, no top_level.txt)."""
    pkg = site / "fleetprobe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "spec.py").write_text(SPEC_PY)
    (pkg / "needs_torch.py").write_text("import torch_not_installed_here\n")
    info = site / "fleetprobe_dist-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: 1.2.3\n")
    (info / "RECORD").write_text("\n".join([
        "fleetprobe_pkg/__init__.py,,", "fleetprobe_pkg/spec.py,,", "fleetprobe_pkg/needs_torch.py,,",
        "fleetprobe_dist-1.2.3.dist-info/METADATA,,", "fleetprobe_dist-1.2.3.dist-info/RECORD,,", "",
    ]))
    (site / "fleetprobe_slow.py").write_text("import time\ntime.sleep(60)\n")


def _build_bad_extension(python: str, site: Path, work: Path) -> bool:
    """A real compiled module whose shared object references a symbol nothing defines."""
    if not shutil.which("gcc"):
        return False
    paths = json.loads(subprocess.run(
        [python, "-c", "import json,sysconfig; print(json.dumps([sysconfig.get_paths()['include'], "
                       "sysconfig.get_config_var('EXT_SUFFIX')]))"],
        capture_output=True, text=True, check=True).stdout)
    if not (Path(paths[0]) / "Python.h").exists():
        return False
    source = work / "badext.c"
    source.write_text(BADEXT_C)
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{paths[0]}", str(source), "-o",
                    str(site / f"fleetprobe_badext{paths[1]}")], check=True, capture_output=True)
    return True


@pytest.fixture(scope="module")
def probe_venv(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    work = tmp_path_factory.mktemp("probe-venv")
    venv = work / "venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = _site_packages(venv)
    _install_fake_dist(site)
    has_ext = _build_bad_extension(str(venv / "bin" / "python"), site, work)
    return SimpleNamespace(path=venv, python=str(venv / "bin" / "python"), site=site, has_ext=has_ext)


def local_inventory(folder: Path, hosts: dict[str, dict[str, Any]]) -> Path:
    """Hosts that run on this machine through a real local agent (no SSH)."""
    doc = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": SYSTEM_PYTHON},
                   "hosts": hosts}}
    path = folder / "local.yml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def local_fleet(inventory: Path) -> Fleet:
    inv = load_inventory(inventory)
    return Fleet(inv, inv.select(None))


@pytest.fixture
def venv_inventory(tmp_path: Path, probe_venv: SimpleNamespace) -> Path:
    return local_inventory(tmp_path, {"a": {"venv": str(probe_venv.path)}, "b": {"venv": str(probe_venv.path)},
                                      "gone": {"venv": str(tmp_path / "no-such-venv")}})


# -- remote modules are what the hosts can run -----------------------------------------------

@pytest.mark.parametrize("path", [REMOTE / "importprobe.py", REMOTE / "http_get.py", REMOTE / "userscript.py",
                                  REMOTE / "launch_args.py", REMOTE / "warmup.py", FAKE_SGLANG,
                                  FAKE_SGLANG.with_name("fake_sglang_api.py"),
                                  *sorted(EXAMPLES.glob("*.py"))], ids=lambda p: p.name)
def test_host_side_code_is_python38_stdlib(path: Path) -> None:
    # The launch-args check and the stand-in import the venv's own sglang parser, and say so when
    # it does not import (a --no-deps venv): nothing else outside the stdlib.
    allowed = {"sglang"} if path.name in ("launch_args.py", "fake_sglang.py") else set()
    if path.name == "launch_args.py":
        allowed.add("smg")  # the gateway released as a service: its args checked by smg's own parser
    if path.name == "fake_sglang.py":
        allowed |= {"fake_sglang_api", "fleetctl"}  # its answers: the package's module, else the sibling file
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or top in allowed or name == "__future__", name


# -- import ---------------------------------------------------------------------------------

def test_import_in_process_reports_file_owner_and_attr() -> None:
    answer = load_remote("importprobe")["main"]({"module": "yaml", "attr": "safe_load"})
    assert answer["imported"] is True
    assert answer["file"].endswith("yaml/__init__.py")
    owner = answer["owners"][0]
    assert (owner["name"], owner["owns_file"]) == ("PyYAML", True)
    assert owner["version"] == metadata.version("PyYAML")
    assert answer["attr_found"] is True and answer["attr_type"] == "function"
    assert answer["attr_repr"] == "<function safe_load>"  # no per-process address: equal answers gather


def test_import_of_stdlib_module_names_python_as_owner() -> None:
    answer = load_remote("importprobe")["main"]({"module": "json.decoder", "attr": "JSONDecodeError"})
    assert answer["imported"] and answer["stdlib"] is True and answer["owners"] == []
    assert answer["attr_type"] == "type"


def test_import_answers_in_a_venv_child(venv_inventory: Path) -> None:
    request = import_core.ImportRequest.parse("fleetprobe_pkg.spec:SpeculativeAlgorithm.DFLASH")
    with local_fleet(venv_inventory) as fleet:
        results = import_core.run_import(fleet, request)
    answer = results["a"].value
    assert answer is not None and answer.imported and answer.present
    assert answer.file is not None and answer.file.endswith("site-packages/fleetprobe_pkg/spec.py")
    assert answer.dist is not None and (answer.dist.name, answer.dist.version) == (DIST_NAME, "1.2.3")
    assert answer.dist.owns_file is True
    assert answer.attr_type == "fleetprobe_pkg.spec.SpeculativeAlgorithm"
    assert answer.attr_repr == "<SpeculativeAlgorithm.DFLASH: 2>"
    # A venv that does not exist fails that host only, saying so.
    assert results["gone"].status is Status.FAILED
    assert "no-such-venv not found: no python at" in results["gone"].reason
    assert results["b"].ok


def test_import_error_is_an_answer_with_the_owner_still_named(venv_inventory: Path) -> None:
    request = import_core.ImportRequest.parse("fleetprobe_pkg.needs_torch")
    with local_fleet(venv_inventory) as fleet:
        res = import_core.run_import(fleet, request)["a"]
    assert res.ok and res.value is not None
    a = res.value
    assert not a.imported and not a.present
    assert (a.error_type, a.error, a.error_name) == ("ModuleNotFoundError",
                                                     "No module named 'torch_not_installed_here'",
                                                     "torch_not_installed_here")
    assert a.file is not None and a.file.endswith("fleetprobe_pkg/needs_torch.py")  # found without running it
    assert a.dist is not None and a.dist.name == DIST_NAME
    assert any("needs_torch.py" in line for line in a.traceback)
    assert not any("importlib" in line for line in a.traceback[:2])  # starts at the imported code


def test_missing_attribute_is_named(venv_inventory: Path) -> None:
    request = import_core.ImportRequest.parse("fleetprobe_pkg.spec:SpeculativeAlgorithm.DDTREE")
    with local_fleet(venv_inventory) as fleet:
        a = import_core.run_import(fleet, request)["a"].value
    assert a is not None and a.imported and a.attr_found is False and not a.present
    assert a.attr_error == "fleetprobe_pkg.spec.SpeculativeAlgorithm has no attribute 'DDTREE'"


def test_undefined_symbol_comes_through_verbatim(venv_inventory: Path, probe_venv: SimpleNamespace) -> None:
    assert probe_venv.has_ext, "gcc or Python.h missing: cannot build the extension (make deps installs them)"
    with local_fleet(venv_inventory) as fleet:
        a = import_core.run_import(fleet, import_core.ImportRequest.parse("fleetprobe_badext"))["a"].value
    assert a is not None and not a.imported
    assert a.error_type == "ImportError"
    so = next(probe_venv.site.glob("fleetprobe_badext*.so"))
    assert a.error == f"{so}: undefined symbol: fleetctl_missing_symbol"


def test_hanging_import_is_stopped_at_the_timeout(venv_inventory: Path) -> None:
    request = import_core.ImportRequest.parse("fleetprobe_slow", timeout=1.5)
    start = time.monotonic()
    with local_fleet(venv_inventory) as fleet:
        results = import_core.run_import(fleet, request)
        # the agent survives its child's timeout: the next probe on the same host works
        again = import_core.run_import(fleet, import_core.ImportRequest.parse("json"))
    assert time.monotonic() - start < 20
    assert results["a"].status is Status.FAILED
    assert results["a"].reason == "import fleetprobe_slow did not finish within 1.5s (stopped)"
    assert again["a"].ok


def test_owner_scan_fallback_matches_packages_distributions(probe_venv: SimpleNamespace,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(probe_venv.site))
    ns = load_remote("importprobe")
    file = str(probe_venv.site / "fleetprobe_pkg" / "spec.py")
    modern, via = ns["owners"]("fleetprobe_pkg", file)
    assert via == "packages_distributions"
    # Python 3.8/3.9: no packages_distributions; the RECORD scan must find the same owner.
    monkeypatch.setitem(ns, "metadata", SimpleNamespace(distributions=metadata.distributions))
    scanned, via = ns["owners"]("fleetprobe_pkg", file)
    assert via == "scan"
    assert scanned == modern and scanned[0]["name"] == DIST_NAME
    assert ns["owners"]("yaml", None)[0][0]["name"] == "PyYAML"  # top_level.txt path of the scan


@pytest.mark.skipif(PY38 is None, reason=NO_PY38)
def test_importprobe_on_real_python38(probe_venv: SimpleNamespace, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(probe_venv.site / "fleetprobe_pkg", site / "fleetprobe_pkg")
    shutil.copytree(probe_venv.site / "fleetprobe_dist-1.2.3.dist-info", site / "fleetprobe_dist-1.2.3.dist-info")
    code = ("import json,sys; ns={'__name__': 'x'}; exec(open(sys.argv[1]).read(), ns); "
            "print(json.dumps(ns['main']({'module': 'fleetprobe_pkg.spec', 'attr': 'SpeculativeAlgorithm'})))")
    proc = subprocess.run([str(PY38), "-c", code, str(REMOTE / "importprobe.py")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)}, check=True)
    answer = json.loads(proc.stdout)
    assert answer["python_version"].startswith("3.8.")
    assert answer["owners_via"] == "scan"
    assert [(o["name"], o["version"], o["owns_file"]) for o in answer["owners"]] == [(DIST_NAME, "1.2.3", True)]


@pytest.mark.parametrize("target", ["bad-name", "a:", ":b", "a:b:c", "a..b", "1abc"])
def test_bad_import_target_is_input_error(target: str) -> None:
    from fleetctl.errors import InputError

    with pytest.raises(InputError, match="expected MODULE"):
        import_core.ImportRequest.parse(target)


def test_cli_import_expectations(venv_inventory: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = ["-i", str(venv_inventory), "-l", "a,b", "probe", "import"]
    ok = run_cli(capsys, *inv, "fleetprobe_pkg.spec:SpeculativeAlgorithm.DFLASH", "--expect", "present")
    assert ok.rc == 0, ok.err
    assert "a,b (2)" in ok.out and f"owner   {DIST_NAME} 1.2.3" in ok.out
    missing = run_cli(capsys, *inv, "fleetprobe_pkg.spec:SpeculativeAlgorithm.DDTREE", "--expect", "present")
    assert missing.rc == 1
    assert "but not on: a, b" in " ".join(missing.err.split())  # rich wraps long lines
    assert run_cli(capsys, *inv, "fleetprobe_pkg.spec:SpeculativeAlgorithm.DDTREE", "--expect", "absent").rc == 0
    failed = run_cli(capsys, "-i", str(venv_inventory), "probe", "import", "json", "--json")
    assert failed.rc == 2
    assert failed.json()["hosts"]["gone"]["status"] == "failed"
    bad = run_cli(capsys, *inv, "not a module")
    assert bad.rc == 3 and len(bad.err.strip().splitlines()) == 1


# -- http -----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture
def fake_sglang() -> Iterator[Callable[..., int]]:
    """Start real fake_sglang processes (each on a free port); stopped by pid afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> int:
        port = free_port()
        proc = subprocess.Popen([SYSTEM_PYTHON, str(FAKE_SGLANG), "--host", "127.0.0.1", "--port", str(port), *args])
        procs.append(proc)
        wait_listening(port, proc)
        return port

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


def http_get(port: int, path: str, **extra: Any) -> http_core.HttpAnswer:
    request = http_core.HttpRequest(path, port, tuple(extra.pop("fields", ())), extra.pop("timeout", 5.0))
    session = SimpleNamespace(vars={})
    doc = load_remote("http_get")["main"](request.params(session))  # type: ignore[arg-type]
    return http_core.HttpAnswer.from_remote(doc, request.fields)


def test_http_server_info_json_and_fields(fake_sglang: Callable[..., int]) -> None:
    port = fake_sglang("--spec-algorithm", "DDTREE", "--accept-length", "3.2", "--version", "0.5.23")
    fresh = http_get(port, "/server_info", fields=["internal_states.0.avg_spec_accept_length"])
    # as SGLang: no acceptance length until a speculative decode step has run
    assert fresh.missing_fields == ("internal_states.0.avg_spec_accept_length",)
    generate(port, 32)
    a = http_get(port, "/server_info", fields=["version", "internal_states.0.avg_spec_accept_length",
                                                "internal_states.-1.avg_spec_accept_length", "nope.x",
                                                "internal_states.5"])
    assert (a.status, a.path, a.fell_back, a.content_type) == (200, "/server_info", False, "application/json")
    assert a.latency_ms is not None and 0 < a.latency_ms < 5000
    assert a.body["speculative_algorithm"] == "DDTREE"
    assert a.fields == {"version": "0.5.23", "internal_states.0.avg_spec_accept_length": 3.2,
                        "internal_states.-1.avg_spec_accept_length": 3.2}
    assert a.missing_fields == ("nope.x", "internal_states.5")
    assert "json" not in a.to_dict() and a.to_dict()["fields"]["version"] == "0.5.23"


def test_http_falls_back_to_old_endpoint_names(fake_sglang: Callable[..., int]) -> None:
    port = fake_sglang("--old-api", "--version", "0.5.9")
    a = http_get(port, "/server_info", fields=["version"])
    assert (a.status, a.asked, a.path, a.fell_back) == (200, "/server_info", "/get_server_info", True)
    assert [(t.path, t.status) for t in a.tried] == [("/server_info", 404), ("/get_server_info", 200)]
    assert a.fields == {"version": "0.5.9"}
    m = http_get(port, "/model_info")
    assert (m.path, m.body["model_path"]) == ("/get_model_info", "Qwen/Qwen3.6-35B-A3B")
    # no fallback for a path that has none: the 404 is the answer
    assert http_get(port, "/nothing").status == 404


def test_http_health_starts_503_then_200_and_text_bodies(fake_sglang: Callable[..., int]) -> None:
    port = fake_sglang("--start-delay", "1.5", "--enable-metrics")
    assert http_get(port, "/health").status == 503
    time.sleep(1.7)
    assert http_get(port, "/health").status == 200
    metrics = http_get(port, "/metrics")
    assert metrics.status == 200 and not metrics.has_json
    assert metrics.content_type is not None and metrics.content_type.startswith("text/plain; version=0.0.4")
    assert metrics.text is not None and "sglang:num_running_reqs" in metrics.text
    assert http_get(port, "/v1/models").body["data"][0]["owned_by"] == "sglang"
    sick = fake_sglang("--health-status", "503")
    assert http_get(sick, "/health").status == 503
    assert http_get(sick, "/metrics").status == 404  # SGLang serves /metrics only with --enable-metrics


def test_stand_in_generations_carry_sglangs_per_request_numbers(fake_sglang: Callable[..., int]) -> None:
    port = fake_sglang("--spec-algorithm", "DDTREE", "--accept-length", "2.5", "--decode-tps", "200")
    start = time.monotonic()
    meta = generate(port, 50)["meta_info"]
    took = time.monotonic() - start
    assert (meta["completion_tokens"], meta["spec_verify_ct"], meta["spec_accept_length"]) == (50, 20, 2.5)
    assert 0.25 <= meta["e2e_latency"] <= took  # 50 tokens at 200 tok/s
    openai = generate(port, 10, "/v1/completions")
    assert openai["object"] == "text_completion" and openai["usage"]["completion_tokens"] == 10
    plain = fake_sglang()  # no speculative decoding: no spec stats
    assert "spec_verify_ct" not in generate(plain, 8)["meta_info"]


def test_http_refused_and_timeout_are_answers() -> None:
    refused = http_get(free_port(), "/health")
    assert (refused.status, refused.error_kind, refused.got) == (None, "refused", "refused")
    assert refused.error is not None and "nothing listens on 127.0.0.1:" in refused.error
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        start = time.monotonic()
        hung = http_get(silent.getsockname()[1], "/health", timeout=1.0)
    assert time.monotonic() - start < 4
    assert (hung.status, hung.error_kind) == (None, "timeout")
    assert hung.error is not None and "within 1s" in hung.error


class _BadJsonHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = b"{not json" if self.path == "/bad" else b"x" * 10000
        self.send_response(200)
        self.send_header("Content-Type", "application/json" if self.path == "/bad" else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_http_invalid_json_and_long_text() -> None:
    server = HTTPServer(("127.0.0.1", 0), _BadJsonHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        bad = http_get(server.server_address[1], "/bad")
        long = http_get(server.server_address[1], "/long")
    finally:
        server.shutdown()
        server.server_close()
    assert bad.status == 200 and not bad.has_json and bad.text == "{not json"
    assert bad.json_error is not None and bad.json_error.startswith("body is not valid JSON")
    assert long.text is not None and len(long.text) == 4000 and long.truncated and long.size == 10000


def test_field_value_paths() -> None:
    doc = {"a": {"b": [{"c": 1}, {"c": None}]}, "x.y": 2}
    assert http_core.field_value(doc, "a.b.0.c") == 1
    assert http_core.field_value(doc, "a.b.1.c") is None  # null is a value, not missing
    assert http_core.field_value(doc, "a.b.2.c") is http_core._MISSING
    assert http_core.field_value(doc, "a.b.x") is http_core._MISSING
    assert http_core.field_value([5, 6], "-1") == 6


def _answer(status: int | None, kind: str | None = None) -> http_core.HttpAnswer:
    return http_core.HttpAnswer.from_remote({"url": "u", "path": "/health", "status": status, "error_kind": kind})


def test_check_status_names_hosts_and_skips_failed_ones() -> None:
    results = {
        "h1": HostResult("h1", Status.OK, _answer(200)),
        "h2": HostResult("h2", Status.OK, _answer(503)),
        "h3": HostResult("h3", Status.OK, _answer(None, "refused")),
        "h4": HostResult[http_core.HttpAnswer]("h4", Status.UNREACHABLE, reason="down"),
    }
    report = http_core.check_status(results, 200, "/health")
    assert not report.ok
    assert report.failing == (("h2", "503"), ("h3", "refused"))
    assert report.message() == "expected /health to answer 200, but not on: h2 (503), h3 (refused)"
    assert http_core.check_status({"h1": results["h1"]}, 200, "/health").ok


def test_cli_http_per_host_ports_and_expect_status(tmp_path: Path, fake_sglang: Callable[..., int],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    good = fake_sglang("--spec-algorithm", "DFLASH", "--accept-length", "2.5")
    generate(good, 25)
    sick = fake_sglang("--health-status", "503", "--old-api")
    inv = str(local_inventory(tmp_path, {"good": {"service_port": good}, "sick": {"service_port": sick}}))
    r = run_cli(capsys, "-i", inv, "probe", "http", "/health", "--expect-status", "200")
    assert r.rc == 1
    assert "but not on: sick (503)" in " ".join(r.err.split())
    assert run_cli(capsys, "-i", inv, "-l", "good", "probe", "http", "/health", "--expect-status", "200").rc == 0
    info = run_cli(capsys, "-i", inv, "probe", "http", "/server_info", "--field",
                   "internal_states.0.avg_spec_accept_length", "--json")
    assert info.rc == 0, info.err
    hosts = info.json()["hosts"]
    assert hosts["good"]["value"]["fields"] == {"internal_states.0.avg_spec_accept_length": 2.5}
    assert hosts["sick"]["value"]["path"] == "/get_server_info"
    human = run_cli(capsys, "-i", inv, "probe", "http", "/server_info", "--field", "version")
    assert "/get_server_info (fallback)" in human.out and "0.5.23" in human.out
    assert run_cli(capsys, "-i", inv, "probe", "http", "health").rc == 3


# -- script ---------------------------------------------------------------------------------

def run_userscript(source: str, **params: Any) -> dict[str, Any]:
    main = load_remote("userscript")["main"]
    return main({"source": textwrap.dedent(source), "name": params.pop("name", "probe.py"),
                 "python": params.pop("python", SYSTEM_PYTHON), **params})


def test_script_json_text_and_args() -> None:
    doc = run_userscript("""
        import json, os, sys
        print(json.dumps({"args": json.loads(os.environ["FLEETCTL_ARGS"]), "argv": sys.argv[1:],
                          "exe": sys.executable, "file": __file__}))
    """, args={"device": "NVIDIA_H200", "msg": "a b=c"})
    assert doc["rc"] == 0 and not doc["timed_out"]
    result = script_core.ScriptResult(doc["python"], doc["rc"], False, doc["duration_s"], doc["stdout"], "",
                                      doc["script_path"])
    is_json, value = result.json_value
    assert is_json and value["args"] == {"device": "NVIDIA_H200", "msg": "a b=c"}
    assert value["argv"] == ["device=NVIDIA_H200", "msg=a b=c"]
    assert value["exe"] == SYSTEM_PYTHON
    assert value["file"] == doc["script_path"] and value["file"].endswith("/probe.py")
    assert not Path(doc["script_path"]).exists()  # the private copy is removed
    text = run_userscript("print('hello'); print('world')")
    assert text["stdout"] == "hello\nworld\n"
    assert script_core.ScriptResult(SYSTEM_PYTHON, 0, False, 0.1, text["stdout"], "", None).to_dict()["text"] == (
        "hello\nworld\n")


def test_script_that_raises_keeps_its_traceback() -> None:
    doc = run_userscript("""
        def inner():
            raise RuntimeError("model not loaded")
        inner()
    """, name="check.py")
    assert doc["rc"] == 1
    assert f'File "{doc["script_path"]}", line 3, in inner' in doc["stderr"]
    assert doc["stderr"].rstrip().endswith("RuntimeError: model not loaded")


def test_script_timeout_kills_it_and_what_it_started() -> None:
    start = time.monotonic()
    doc = run_userscript("""
        import subprocess, sys, time
        child = subprocess.Popen(["sleep", "60"])
        print("child", child.pid, flush=True)
        time.sleep(60)
    """, timeout=1.5)
    assert time.monotonic() - start < 10
    assert doc["timed_out"] and doc["rc"] == -9
    pid = int(doc["stdout"].split()[1])  # printed before the kill: not lost
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_script_missing_python_is_reported() -> None:
    doc = run_userscript("print(1)", python="/nonexistent/bin/python")
    assert doc["error"] == "no python at /nonexistent/bin/python" and doc["rc"] is None


def test_parse_args_and_load_errors(tmp_path: Path) -> None:
    from fleetctl.errors import InputError

    assert script_core.parse_args(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    for bad in (["novalue"], ["=v"], ["a b=1"]):
        with pytest.raises(InputError, match="expected KEY=VALUE"):
            script_core.parse_args(bad)
    with pytest.raises(InputError, match="missing.py: cannot read the script"):
        script_core.ScriptRequest.load(str(tmp_path / "missing.py"))
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1\ndef f(:\n")
    with pytest.raises(InputError, match=r"broken.py:2: syntax error"):
        script_core.ScriptRequest.load(str(broken))


def test_run_script_marks_failures_and_gathers(tmp_path: Path, probe_venv: SimpleNamespace) -> None:
    inv = local_inventory(tmp_path, {"a": {"venv": str(probe_venv.path)}, "b": {"venv": str(probe_venv.path)},
                                     "c": {}, "gone": {"venv": str(tmp_path / "nope")}})
    boom = tmp_path / "boom.py"
    boom.write_text("import sys\nprint(sys.prefix)\n1 / 0\n")
    with local_fleet(inv) as fleet:
        results = script_core.run_script(fleet, script_core.ScriptRequest.load(str(boom)))
    assert results["a"].status is Status.FAILED
    assert results["a"].reason == "exited 1: ZeroDivisionError: division by zero"
    assert results["a"].value is not None and results["a"].value.stdout.strip() == str(probe_venv.path)
    assert results["c"].value is not None and results["c"].value.python == SYSTEM_PYTHON  # the agent's own
    assert results["gone"].reason == f"venv {tmp_path / 'nope'} not found: no python at {tmp_path / 'nope'}/bin/python"
    blocks = script_core.gather_outputs(results, "boom.py")
    venv_block = next(b for b in blocks if "a" in b.hosts)
    assert venv_block.hosts == ("a", "b")  # different temp paths on each host still gather
    assert 'File "boom.py", line 3' in venv_block.stderr


def test_cli_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = str(local_inventory(tmp_path, {"a": {}, "b": {}}))
    script = tmp_path / "echo_args.py"
    script.write_text("import json, os\nprint(json.dumps(json.loads(os.environ['FLEETCTL_ARGS'])))\n")
    r = run_cli(capsys, "-i", inv, "probe", "script", str(script), "--arg", "k=v", "--json")
    assert r.rc == 0, r.err
    assert r.json()["hosts"]["a"]["value"]["json"] == {"k": "v"}
    human = run_cli(capsys, "-i", inv, "probe", "script", str(script), "--arg", "k=v")
    assert "a,b (2)" in human.out and '"k": "v"' in human.out
    bad_arg = run_cli(capsys, "-i", inv, "probe", "script", str(script), "--arg", "oops")
    assert bad_arg.rc == 3 and bad_arg.err.strip() == (
        "fleetctl: error: --arg 'oops': expected KEY=VALUE (e.g. --arg device=NVIDIA_H200)")
    missing = run_cli(capsys, "-i", inv, "probe", "script", str(tmp_path / "nope.py"))
    assert missing.rc == 3 and "nope.py: cannot read the script" in missing.err


def test_example_scripts_against_fake_sglang_and_real_sglang_layout(
        tmp_path: Path, fake_sglang: Callable[..., int], capsys: pytest.CaptureFixture[str]) -> None:
    port = fake_sglang("--spec-algorithm", "DDTREE", "--accept-length", "3.4", "--old-api")
    generate(port, 34)  # a fresh server has no acceptance length yet
    doc = run_userscript((EXAMPLES / "spec_accept_len.py").read_text(), args={"port": str(port)})
    assert doc["rc"] == 0, doc["stderr"]
    assert json.loads(doc["stdout"]) == {
        "avg_spec_accept_length": 3.4, "speculative_algorithm": "DDTREE", "speculative_num_draft_tokens": 16,
        "version": "0.5.23", "endpoint": "/get_server_info"}
    down = run_userscript((EXAMPLES / "spec_accept_len.py").read_text(), args={"port": str(free_port())})
    assert down["rc"] == 1 and "no server info from" in down["stderr"]
    # moe_configs against a package tree laid out like sglang 0.5.23's
    site = tmp_path / "site"
    configs = site / "sglang" / "srt/layers/moe/moe_runner/triton_utils/configs"
    for folder, name in [("triton_3_4_0", "E=512,N=128,device_name=NVIDIA_H200.json"),
                         ("triton_3_4_0", "E=128,N=192,device_name=NVIDIA_H100_80GB_HBM3.json"),
                         ("triton_3_7_1", "E=512,N=160,device_name=NVIDIA_H200.json")]:
        (configs / folder).mkdir(parents=True, exist_ok=True)
        (configs / folder / name).write_text("{}")
    (site / "sglang" / "__init__.py").write_text("raise SystemExit('must not be imported')\n")
    code = f"import sys; sys.path.insert(0, {str(site)!r})\n" + (EXAMPLES / "moe_configs.py").read_text()
    doc = run_userscript(code, args={"device": "NVIDIA_H200"})
    assert doc["rc"] == 0, doc["stderr"]
    found = json.loads(doc["stdout"])
    assert found["folders"] == {"triton_3_4_0": ["E=512,N=128,device_name=NVIDIA_H200.json"],
                                "triton_3_7_1": ["E=512,N=160,device_name=NVIDIA_H200.json"]}
    assert found["count"] == 2 and found["source"].endswith("moe_runner/triton_utils/configs")
