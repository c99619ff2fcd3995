"""The sglang lab fixture itself: real wheels, real venvs, the versions the probe tests rely on."""

from __future__ import annotations

import pytest
from lab_support import LabHandle
from sglang_support import LAYOUT, ML_VENV

pytestmark = pytest.mark.lab


def test_each_host_has_its_sglang_release(sglang_lab: LabHandle) -> None:
    for host, version in LAYOUT.items():
        got = sglang_lab.ssh(host, f"{ML_VENV}/bin/python -c "
                             "'import importlib.metadata as m; print(m.version(\"sglang\"))'").stdout.strip()
        assert got == version
