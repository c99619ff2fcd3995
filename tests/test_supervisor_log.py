"""The supervisor rotates its server's log by size (fleetctl/remote/supervisor.py), run here as on a
host: ``python3 supervisor.py CONFIG`` supervising a real process that writes without pause."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_support import wait_until

from fleetctl.remote import supervisor

# about 1 MB/s, a very chatty server: unpaced, it wrote gigabytes between two of the supervisor's 5 s checks
# and the supervisor, copying them, missed the test's SIGTERM deadline on a loaded CI machine
CHATTY = ("import sys, time\nwhile True:\n    sys.stdout.write('x' * 999 + '\\n')\n    sys.stdout.flush()\n"
          "    time.sleep(0.001)\n")
LIMIT = 200_000


def test_a_server_log_is_rotated_by_size_and_keeps_its_limit_of_files(tmp_path: Path) -> None:
    log = tmp_path / "sglang.log"
    config = tmp_path / "sglang.supervisor.json"
    config.write_text(json.dumps({
        "command": [sys.executable, "-c", CHATTY], "env_file": "", "cwd": str(tmp_path), "log": str(log),
        "pidfile": str(tmp_path / "sglang.pid"), "supervisor_pidfile": str(tmp_path / "sglang.supervisor.pid"),
        "state_file": str(tmp_path / "sglang.state.json"), "log_max_bytes": LIMIT, "log_keep": 2}))
    sup = subprocess.Popen([sys.executable, supervisor.__file__, str(config)], start_new_session=True)
    try:
        # two rotations at least: .1 shifted to .2, and never a third kept file
        wait_until(lambda: (tmp_path / "sglang.log.2").exists(), "a second rotation (sglang.log.2)",
                   timeout=120, alive=lambda: None if sup.poll() is None else pytest.fail("the supervisor exited"))
        wait_until(lambda: log.stat().st_size > 0, "the server writing to the emptied log again", timeout=60)
    finally:
        os.killpg(sup.pid, signal.SIGTERM)  # the supervisor leaves its server to the caller
        sup.wait(timeout=30)
        pid = supervisor.read_pid(str(tmp_path / "sglang.pid"))[0]
        if pid:
            os.kill(pid, signal.SIGKILL)
    assert sorted(p.name for p in tmp_path.glob("sglang.log*")) == ["sglang.log", "sglang.log.1", "sglang.log.2"]
    assert (tmp_path / "sglang.log.1").stat().st_size > LIMIT
    # written at the end of the emptied file (append), not at the old offset behind a hole
    stat = log.stat()
    assert stat.st_blocks * 512 + 65536 >= stat.st_size, (stat.st_size, stat.st_blocks)
