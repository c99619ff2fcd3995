# The host side of the task keywords `async`/`poll` and the module `async_status`: a job runs
# detached from the agent and its SSH session, and its state lives in a file the controller reads
# over short calls (Ansible's async_wrapper and ~/.ansible_async, in fleetctl's state dir).
#
# Stdlib only, Python >= 3.8. params: {action, jid, dir}; action "start" adds {command (a shell
# line; with kind "python", Python code run by this interpreter, its input on stdin), timeout
# (seconds, the job's limit), code (this module's inline source, run as the job's
# runner)}. The job file DIR/JID.json (0600 in a 0700 folder, replaced atomically) holds
# {ansible_job_id, started, finished, pid, pgid, kind} and, once finished, {rc, stdout, stderr, failed, msg,
# start, end, delta}. The runner is started through an intermediate process that exits at once
# (a double fork), in a session of its own: the agent and the SSH session may end before the job.
# The job's command runs in its own process group, killed whole at the time limit.
# fleetctl-include: writable
import json
import os
import re
import signal
import subprocess
import sys
import time

KEEP = 64 * 1024  # the tail of stdout/stderr a job file keeps
_JID = re.compile(r"^j[0-9]+\.[0-9]+$")
TIMED_OUT = "async task did not complete within the requested time - %ss"
_LAUNCH = ("import subprocess,sys;subprocess.Popen([sys.executable,'-c',sys.argv[1],sys.argv[2]],"
           "stdin=subprocess.DEVNULL,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL,"
           "start_new_session=True,close_fds=True)")


class AsyncJobError(Exception):
    pass


def _folder(params):
    return user_cache_dir(params["dir"], "async")  # noqa: F821  (writable, included)


def _paths(params):
    jid = str(params.get("jid") or "")
    if not _JID.match(jid):
        raise AsyncJobError("async_status: %r is not a job id (as `ansible_job_id` gives it)" % jid)
    base = os.path.join(_folder(params), jid)
    return jid, base + ".json"


def _save(path, record):
    why = write_private(path, json.dumps(record).encode())
    if why:
        raise AsyncJobError("%s: job file not written: %s" % (path, why.replace("cache not saved: ", "")))


def _load(path, jid):
    data, why = read_private(path)
    if data is None:
        raise AsyncJobError("could not find job %s (%s)" % (jid, why or "no job file %s" % path))
    return json.loads(data.decode())


def main(params):
    action = params.get("action")
    jid, path = _paths(params)
    if action == "start":
        return _start(params, jid, path)
    if action == "status":
        return _load(path, jid)
    if action == "kill":
        return _kill(path, jid, params.get("msg") or "killed")
    if action == "cleanup":
        for name in [path] + [path[:-5] + ext for ext in (".out", ".err", ".killed", ".spec")]:
            if os.path.exists(name):
                os.unlink(name)
        return {"ansible_job_id": jid, "erased": path}
    raise AsyncJobError("unknown action %r" % action)


def _start(params, jid, path):
    record = {"ansible_job_id": jid, "started": 1, "finished": 0, "results_file": path, "pid": None, "pgid": None}
    _save(path, record)  # before the runner starts: a status asked at once finds the job
    spec = {"jid": jid, "path": path, "command": params["command"], "timeout": params["timeout"],
            "kind": params.get("kind") or "shell", "input": params.get("input")}
    _save(path[:-5] + ".spec", spec)  # the command may hold secrets: not in the runner's argv
    code = params["code"] + ";run_job(%r)" % (path[:-5] + ".spec")
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCH, code, ""], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    launcher.wait()
    return record


def _tail(path):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - KEEP))
            return handle.read().decode("utf-8", "replace")
    except (IOError, OSError):
        return ""


def run_job(spec_path):
    """The detached runner: the job's command in its own process group, its result in the job file."""
    with open(spec_path) as handle:
        spec = json.load(handle)
    os.unlink(spec_path)
    path, limit = spec["path"], float(spec["timeout"])
    out_path, err_path = path[:-5] + ".out", path[:-5] + ".err"
    started = time.time()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        argv = ["/bin/sh", "-c", spec["command"]] if spec["kind"] == "shell" else [sys.executable, "-c", spec["command"]]
        given = spec.get("input")  # a module's parameters (a URL may carry a token): on stdin, not in argv
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if given else subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True, close_fds=True)
    if given:
        try:
            proc.stdin.write(given.encode())
            proc.stdin.close()
        except (IOError, OSError):
            pass  # the job ended before reading: its exit status says why
    record = {"ansible_job_id": spec["jid"], "started": 1, "finished": 0, "results_file": path,
              "pid": os.getpid(), "pgid": proc.pid, "kind": spec["kind"]}
    _save(path, record)
    try:
        rc = proc.wait(timeout=limit)
        failed, msg = rc != 0, "" if rc == 0 else "non-zero return code"
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.wait()
        rc, failed, msg = None, True, TIMED_OUT % spec["timeout"]
    ended = time.time()
    record.update(finished=1, rc=rc, failed=failed, msg=msg, changed=True, stdout=_tail(out_path),
                  stderr=_tail(err_path), start=started, end=ended, delta=round(ended - started, 3))
    if not os.path.exists(path[:-5] + ".killed"):  # the controller's kill wrote its own end
        _save(path, record)
    for name in (out_path, err_path):
        os.unlink(name)


def _kill_group(pgid):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except OSError:
            return
        time.sleep(0.5 if sig == signal.SIGTERM else 0)


def _kill(path, jid, msg):
    """The controller gave up on the job (its time passed and no runner ended it): end it, say why."""
    record = _load(path, jid)
    if record.get("finished"):
        return record
    open(path[:-5] + ".killed", "w").close()
    if record.get("pgid"):
        _kill_group(record["pgid"])
    if record.get("pid"):
        _kill_group(record["pid"])  # the runner leads its own session: its group is its pid
    record.update(finished=1, failed=True, rc=None, msg=msg, stdout="", stderr="")
    _save(path, record)
    return record
