"""Other Python interpreters on this machine, found honestly (never a hard-coded path).

The host-side scripts promise Python >= 3.8. Debian 12 ships only 3.11, so a 3.8 is found where
one was installed: $FLEETCTL_TEST_PY38, python3.8 on PATH (pyenv shims included), /usr/bin,
/usr/local/bin, pyenv's and uv's install folders. Each candidate is run and must say it is 3.8.
When none is found the tests that need it skip with NO_PY38, a skip on tests/skip_allowlist.py.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess

NO_PY38 = "no Python 3.8 interpreter on this machine"


def _candidates(version: str) -> list[str]:
    name = f"python{version}"
    found = [os.environ.get(f"FLEETCTL_TEST_PY{version.replace('.', '')}", "")]
    found.append(shutil.which(name) or "")
    found += [f"/usr/bin/{name}", f"/usr/local/bin/{name}"]
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found += sorted(glob.glob(f"{pyenv}/versions/{version}.*/bin/{name}"), reverse=True)
    uv = os.environ.get("UV_PYTHON_INSTALL_DIR") or os.path.expanduser("~/.local/share/uv/python")
    found += sorted(glob.glob(f"{uv}/cpython-{version}.*/bin/{name}"), reverse=True)
    return [c for c in found if c]


@functools.cache
def find_python(version: str) -> str | None:
    """The real executable of a working Python `version` ("3.8"), or None."""
    for candidate in _candidates(version):
        try:
            proc = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2]); "
                                   "print(sys.executable)"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = proc.stdout.split()
        if proc.returncode == 0 and len(lines) == 2 and lines[0] == version:
            return lines[1]  # the interpreter itself, not a shim in front of it
    return None
