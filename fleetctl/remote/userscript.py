"""Run the user's own stdlib-only script on this host under a chosen python, as a subprocess.

Stdlib only, Python >= 3.8. Runs inside the agent; the script runs in a child process, so a
script that hangs or crashes never takes the agent with it. The source came in the request; it is
written to a private temporary folder (mode 0700) so tracebacks name a real file, and removed after.

The script contract (also in examples/probes/README.md):
  - arguments: environment variable FLEETCTL_ARGS holds a JSON object of strings, and
    sys.argv[1:] holds the same as "key=value" strings;
  - stdout: print one JSON document to get it back parsed, anything else comes back as text;
  - exit status: non-zero (an uncaught exception too) marks the host failed;
  - stdin is empty; the working directory is the agent's (the login user's home over SSH).

params:
  source:  the script's text
  name:    its file name (for tracebacks)
  python:  interpreter to run it (default: the agent's own)
  args:    {key: value} strings
  timeout: seconds before the script (and its process group) is killed
  max_output: characters of stdout and of stderr kept
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MAX_OUTPUT = 1024 * 1024
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def main(params):
    python = params.get("python") or sys.executable
    answer = {"python": python, "rc": None, "timed_out": False, "duration_s": None, "stdout": "", "stderr": "",
              "stdout_truncated": False, "stderr_truncated": False, "script_path": None, "error": None}
    if not os.path.isfile(python):
        answer["error"] = "no python at %s" % python
        return answer
    workdir = tempfile.mkdtemp(prefix="fleetctl-script-")  # 0700: private to this user
    try:
        path = os.path.join(workdir, script_name(params.get("name")))
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(params["source"])
        answer["script_path"] = path
        answer.update(run(python, path, params))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return answer


def script_name(name):
    base = SAFE_NAME.sub("_", os.path.basename(name or "")) or "script.py"
    return base if base.endswith(".py") else base + ".py"


def run(python, path, params):
    args = params.get("args") or {}
    env = dict(os.environ)
    env["FLEETCTL_ARGS"] = json.dumps(args)
    env["PYTHONUNBUFFERED"] = "1"  # what a killed script printed before the timeout still comes back
    env["PYTHONIOENCODING"] = "utf-8"
    argv = [python, path] + ["%s=%s" % (k, v) for k, v in args.items()]
    timeout = float(params.get("timeout") or 60)
    limit = int(params.get("max_output") or MAX_OUTPUT)
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        out, err = stop(proc)
    result = {"rc": proc.returncode, "timed_out": timed_out, "duration_s": round(time.perf_counter() - start, 3)}
    for key, data in (("stdout", out), ("stderr", err)):
        text = (data or b"").decode("utf-8", "backslashreplace")  # bytes that are not UTF-8 as \xNN
        result[key] = text[:limit]
        result[key + "_truncated"] = len(text) > limit
    return result


def stop(proc):
    """Kill the script and everything it started (its own session), then collect what it printed."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    try:
        return proc.communicate(timeout=5)
    except subprocess.TimeoutExpired as exc:  # a grandchild escaped the group and holds the pipes
        proc.stdout.close()
        proc.stderr.close()
        proc.wait()
        return exc.stdout or b"", exc.stderr or b""
