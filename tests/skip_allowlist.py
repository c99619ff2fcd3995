"""The only skips a run may have, each with why it is legitimate (tests/skip_guard.py enforces it).

Each entry: a node-id pattern (fnmatch) -> (the start of the skip's own reason, why it is allowed).
A skip that matches no entry fails the run, whatever the other results. An xfail (a test expected to
fail, or one that passed anyway) is the same: ALLOWED_XFAILS, node-id pattern -> why.
"""

from __future__ import annotations

from interpreters import NO_PY38

ALLOWED_SKIPS: dict[str, tuple[str, str]] = {
    "tests/test_facts.py::*[[]python3.8[]]": (
        NO_PY38,
        "Debian 12 packages no Python 3.8 and the Makefile installs only from Debian and PyPI; the "
        "host-side scripts are still checked against 3.8 grammar (tests/test_remote_py38.py). "
        "Set FLEETCTL_TEST_PY38 or install one with pyenv or uv to run it."),
    "tests/test_probe_runtime.py::test_importprobe_on_real_python38": (
        NO_PY38,
        "as above: no Python 3.8 on a plain Debian 12 machine; set FLEETCTL_TEST_PY38 to run it."),
    "tests/test_remote_py38.py::test_host_modules_load_on_every_interpreter_here[[]python3.8[]]": (
        NO_PY38,
        "as above: no Python 3.8 on a plain Debian 12 machine; set FLEETCTL_TEST_PY38 to run it."),
}

ALLOWED_XFAILS: dict[str, str] = {}
