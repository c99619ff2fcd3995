"""Lock liveness on a controller without /proc: a live run's lock never reads as stale.

The child runs in a mount namespace of its own with an empty tmpfs over /proc (as on a controller
without procfs); the pids it judges are real processes of this machine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from fleetctl.liveness import process_start

JUDGE = """
import json, sys
from fleetctl.release.hostlock import locked_message
from fleetctl.liveness import holder_alive
holder = json.loads(sys.argv[1])
print(json.dumps({"alive": holder_alive(holder), "message": locked_message(holder, True)}))
"""


def judge_without_proc(holder: dict[str, object]) -> dict[str, object]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("needs root and unshare (util-linux) to hide /proc in a mount namespace")
    script = 'mount -t tmpfs none /proc && test ! -e /proc/self && exec "$0" "$@"'
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                           sys.executable, "-c", JUDGE, json.dumps(holder)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_live_run_is_alive_without_proc_and_its_lock_is_not_broken() -> None:
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        holder = {"controller": socket.gethostname(), "pid": sleeper.pid, "pid_start": process_start(sleeper.pid),
                  "user": "root", "command": "deploy x"}
        answer = judge_without_proc(holder)
        assert answer["alive"] is True
        assert "that run is alive: not breaking its lock" in str(answer["message"])
    finally:
        sleeper.kill()
        sleeper.wait()
    # the same run, ended: without /proc the kernel still says the pid is gone
    answer = judge_without_proc(holder)
    assert answer["alive"] is False and "stale" in str(answer["message"])
