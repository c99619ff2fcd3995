# fleetctl agent: one long-lived process per host and run, started over one SSH channel.
#
# Stdlib only, Python >= 3.8. Protocol on stdin/stdout: a magic hello line, then every
# message is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. The first
# message is unasked: {"id": 0, "ok": true, "result": <what "ping" answers>}, so a fresh agent
# needs no round trip before its first real request.
# Requests: {"id", "op": "call"|"ping"|"exit", "module", "hash", "source"?, "params", "python"?, "timeout"?,
#            "fresh"?, "progress"?} -- "fresh": run the module in a new namespace (a new command on a kept
#            agent); "progress": the module may send progress frames {"id", "progress": {...}} before its
#            answer (it calls AGENT_PROGRESS(doc), None when not asked; in the agent only, not in a child)
#           {"id", "op": "sequence", "steps": [{"module", "hash", "source"?, "params"}, ...]} -- calls in
#            the agent, in order, to the first failure; answered with one answer per step that ran.
#            The host finishes a sequence even when the controller goes away meanwhile.
# Answers:  {"id", "ok": true, "spans"?, "result": ...} | {"id", "ok": false, "error": {"type", "message",
#           "traceback"}}, in that key order (the connection server passes a result on undecoded: encode_answer)
# Module source is shipped once per run and cached here by hash. The agent exits at EOF on
# stdin, so it never outlives the connection that started it.
#
# Its start is paid on every host of every command: it imports only what a ping needs (no json,
# re, platform, subprocess, threading or traceback: some 40 ms of a host's CPU); the rest is
# imported where it is used.
import os
import sys

import _struct as struct  # struct.py only re-exports it

MAGIC = b"\x00FLEETCTL-AGENT-1\n"

# Sequences in flight (see Agent.sequence): the watchdog lets them end before the agent exits.
FINISHING = [0, None]  # count, and the lock the watchdog holds while it decides to exit

# json's own C scanner and encoder, set up as json.loads and json.dumps(..., default=str) set
# them up, without importing json (and re with it); json itself where _json is missing. Shared
# with the child runner below, which runs it too.
CODEC = r"""
def codec():
    try:
        from _json import encode_basestring_ascii, make_encoder, make_scanner

        class Context(object):
            strict, object_hook, object_pairs_hook, parse_float, parse_int = True, None, None, float, int
            parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__

        scan = make_scanner(Context())
        make_encoder({}, str, encode_basestring_ascii, None, ": ", ", ", False, False, True)
    except Exception:
        import json
        return json.loads, lambda value: json.dumps(value, default=str)

    def loads(text):
        text = text.strip(" \t\n\r")
        try:
            value, end = scan(text, 0)
            if end == len(text):
                return value
        except (StopIteration, ValueError):
            pass
        import json  # not JSON: json's own error
        return json.loads(text)

    def dumps(value):
        return "".join(make_encoder({}, str, encode_basestring_ascii, None, ": ", ", ", False, False, True)(value, 0))
    return loads, dumps
"""
exec(CODEC)
loads, dumps = codec()  # noqa: F821 (defined by CODEC)


def user_name():
    """Who the agent runs as (under become: the become user, not the login)."""
    try:
        import pwd
        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return str(os.geteuid())

# Compiled code of the modules run here or in a child interpreter (CODE_STORE), private to this user.
CODE_CACHE = ("/var/lib/fleetctl/cache/code" if os.geteuid() == 0
              else os.path.join(os.path.expanduser("~"), ".cache", "fleetctl", "code"))
BEGIN = "@@FLEETCTL-JSON-BEGIN@@"
END = "@@FLEETCTL-JSON-END@@"

# Compiled module code, cached by source hash and interpreter (a content address): the next
# command's call of the same module under the same python skips compiling it (20-30 ms of a
# host's CPU for the larger modules). Only a folder private to this user is trusted, since its
# files are executed. Shared with the child runner below, which runs it too.
CODE_STORE = r"""
def private(folder):
    st = os.stat(folder)
    return st.st_uid == os.getuid() and not st.st_mode & 0o077


def stored_code(source, module, key, folder):
    import marshal
    path = os.path.join(folder, "%s-%s.code" % (key, sys.implementation.cache_tag)) if folder and key else None
    try:
        if path and os.path.isdir(folder) and private(folder):
            with open(path, "rb") as handle:
                return marshal.loads(handle.read())
    except (OSError, ValueError, EOFError, TypeError):
        pass
    compiled = compile(source, "<fleetctl-remote:%s>" % module, "exec")
    try:
        if path:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            if private(folder):
                tmp = "%s.%d" % (path, os.getpid())
                with open(tmp, "wb") as handle:
                    handle.write(marshal.dumps(compiled))
                os.rename(tmp, path)
    except OSError:
        pass
    return compiled
"""
exec(CODE_STORE)

# Runs one module under another interpreter (a venv's python). stdout is kept for the
# delimited answer alone: anything the module prints goes to stderr. A module that sets
# EXIT_AT_ONCE = True has the process end right after its answer (no interpreter teardown).
CHILD_RUNNER = r"""
import os, sys
""" + CODEC + CODE_STORE + r"""

loads, dumps = codec()
req = loads(sys.stdin.read())
out, sys.stdout = sys.stdout, sys.stderr

ns = {}
try:
    ns["__name__"] = "fleetctl_remote_" + req["module"]
    exec(stored_code(req["source"], req["module"], req.get("hash"), req.get("cache_dir")), ns)
    res = {"ok": True, "result": ns["main"](req["params"])}
except BaseException as e:
    import traceback  # only now: its import is a few ms of every child's start
    res = {"ok": False, "error": {"type": type(e).__name__, "message": str(e),
                                  "traceback": traceback.format_exc(),
                                  "filename": getattr(e, "filename", None)}}
out.write("\n%s\n%s\n%s\n" % (req["begin"], dumps(res), req["end"]))
out.flush()
if ns.get("EXIT_AT_ONCE") is True:  # a module with nothing to tidy up: skip the interpreter's teardown
    sys.stderr.flush()
    os._exit(0)
"""


def _error(exc, tb=None):
    import traceback

    err = {"type": type(exc).__name__, "message": str(exc), "traceback": tb or traceback.format_exc()}
    if isinstance(exc, PermissionError):
        not_permitted(err, exc.filename)
    return err


def login_name():
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        return "uid %d" % os.geteuid()


def not_permitted(err, filename):
    """A PermissionError that got past an operation's own check becomes the same one line (the
    operations check first: see writable.py), never a raw errno and traceback for the user."""
    if filename:
        line = "cannot write %s as %s: run with --become (-b)" % (filename, login_name())
    else:
        line = "permission denied as %s (%s): run with --become (-b)" % (login_name(), err["message"])
    err.update(type="NotPermitted", message=line)


def read_exact(stream, n):
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def write_message(out, obj):
    data = dumps(obj).encode("utf-8")
    out.write(struct.pack(">I", len(data)) + data)
    out.flush()


SPANS_MIN = 4096  # a result this long (encoded) says where each of its top-level values lies


def encode_answer(answer):
    """An answer's bytes, id then ok first. A large object result comes with "spans" (where each
    top-level value lies in the result's text, from its "{"), so the connection server can send a
    value several hosts answered alike once, without decoding it (transport/agent_pass.py). The
    text is ASCII (the encoder escapes the rest): offsets in characters are offsets in bytes."""
    result = answer.get("result")
    plain = answer.get("ok") is True and len(answer) == 3 and "id" in answer  # id, ok, result: nothing else
    if plain and type(result) is dict and result and all(type(k) is str for k in result):
        parts, spans, pos = [], [], 1
        for key, value in result.items():
            head, text = dumps(key) + ": ", dumps(value)
            pos += len(head)
            spans += [pos, pos + len(text)]
            parts.append(head + text)
            pos += len(text) + 2
        body = "{" + ", ".join(parts) + "}"
        if len(body) >= SPANS_MIN:
            return ('{"id": %s, "ok": true, "spans": %s, "result": %s}'
                    % (dumps(answer.get("id")), dumps(spans), body)).encode("utf-8")
    return dumps(dict({"id": answer.get("id"), "ok": answer.get("ok")}, **answer)).encode("utf-8")


class Agent(object):
    def __init__(self, out=None):
        self.out = out  # where progress frames go (the protocol's stdout)
        self.modules = {}  # hash -> [module name, source, namespace or None, code or None]
        # Values derived from a file, kept between the commands a kept agent serves; a module keys
        # each by the file's identity (path, size, mtime_ns, inode, ctime_ns), so a changed file
        # is never answered from it. A child process has none.
        self.memo = {}

    def load(self, req):
        h = req["hash"]
        if h not in self.modules:
            if req.get("source") is None:
                raise LookupError("module %s (%s) not cached on this agent" % (req["module"], h))
            self.modules[h] = [req["module"], req["source"], None, None]
        return self.modules[h]

    def call(self, req):
        entry = self.load(req)
        python = req.get("python")
        if python:
            return self.call_child(python, entry[0], entry[1], req["hash"], req.get("params") or {},
                                   req.get("timeout"))
        if entry[3] is None:
            entry[3] = stored_code(entry[1], entry[0], req["hash"], CODE_CACHE)  # noqa: F821 (CODE_STORE)
        if entry[2] is None or req.get("fresh"):
            # A kept agent (persistent connections) serves many commands: each starts with the
            # module's top level run again, so no module state outlives the command.
            ns = {"__name__": "fleetctl_remote_" + entry[0], "AGENT_MEMO": self.memo}
            exec(entry[3], ns)
            entry[2] = ns
        entry[2]["AGENT_PROGRESS"] = self.progress_writer(req) if req.get("progress") else None
        try:
            return {"ok": True, "result": entry[2]["main"](req.get("params") or {})}
        finally:
            entry[2]["AGENT_PROGRESS"] = None

    def progress_writer(self, req):
        """A progress frame's sender for this request (its id: the controller knows whose it is)."""
        out, rid = self.out, req.get("id")
        if out is None:
            return None
        return lambda doc: write_message(out, {"id": rid, "progress": doc})

    def call_child(self, python, module, source, digest, params, timeout):
        if not os.path.exists(python):
            return {"ok": False, "error": {"type": "InterpreterNotFound",
                                           "message": "no python at %s" % python, "traceback": ""}}
        import subprocess

        payload = dumps({"module": module, "source": source, "params": params, "begin": BEGIN, "end": END,
                              "hash": digest, "cache_dir": CODE_CACHE})
        proc = subprocess.run([python, "-c", CHILD_RUNNER], input=payload.encode("utf-8"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        text = proc.stdout.decode("utf-8", "replace")
        start, stop = text.rfind(BEGIN), text.rfind(END)
        if start < 0 or stop < start:
            tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-5:]
            return {"ok": False, "error": {"type": "ChildFailed", "traceback": "",
                                           "message": "%s exited %s: %s" % (python, proc.returncode, " | ".join(tail))}}
        answer = loads(text[start + len(BEGIN):stop])
        err = answer.get("error") or {}
        if err.get("type") == "PermissionError":
            not_permitted(err, err.get("filename"))
        return answer

    def sequence(self, req):
        """Steps called in order to the end or the first failure, even when the controller goes away
        meanwhile (a switch and the restart after it are never cut in two by a killed run)."""
        lock = FINISHING[1]
        if lock is not None:
            lock.acquire()  # not while the watchdog is deciding to exit: then nothing starts
        FINISHING[0] += 1
        if lock is not None:
            lock.release()
        answers = []
        try:
            for step in req.get("steps") or []:
                try:
                    answer = self.call(dict(step, python=None))
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:
                    answer = {"ok": False, "error": _error(exc)}
                answers.append(answer)
                if not answer.get("ok"):
                    break
        finally:
            FINISHING[0] -= 1
        return {"ok": True, "result": answers}

    def handle(self, req):
        op = req.get("op")
        if op == "ping":
            return {"ok": True, "result": ping_info()}
        if op == "call":
            return self.call(req)
        if op == "sequence":
            return self.sequence(req)
        raise ValueError("unknown op %r" % (op,))


def ping_info():
    # platform.python_version() and platform.node() without importing platform (and re)
    return {"python": sys.executable, "version": sys.version.split()[0], "pid": os.getpid(),
            "hostname": os.uname().nodename, "user": user_name()}


def serve(inp, out):
    agent = Agent(out)
    out.write(MAGIC)
    write_message(out, {"id": 0, "ok": True, "result": ping_info()})
    while True:
        header = read_exact(inp, 4)
        if header is None:
            return 0
        body = read_exact(inp, struct.unpack(">I", header)[0])
        if body is None:
            return 0
        req = loads(body.decode("utf-8"))
        if req.get("op") == "exit":
            write_message(out, {"id": req.get("id"), "ok": True, "result": None})
            return 0
        try:
            answer = agent.handle(req)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit from a module too: the agent goes on, the caller gets the error
            answer = {"ok": False, "error": _error(exc)}
        answer["id"] = req.get("id")
        data = encode_answer(answer)
        out.write(struct.pack(">I", len(data)) + data)
        out.flush()


def watchdog(fd, ppid):
    # An operation that hangs must not outlive the run: exit as soon as the controller's end
    # of stdin is gone (channel closed) or our parent (the SSH session) went away; a sequence
    # in flight is let finish first.
    import _thread
    import select
    import time

    FINISHING[1] = _thread.allocate_lock()

    def watch():
        poller = select.poll()
        poller.register(fd, select.POLLHUP)
        gone = False
        while not gone:
            for _fd, event in poller.poll(1000):
                if event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    gone = True
            if os.getppid() != ppid:
                gone = True
        while True:
            with FINISHING[1]:
                if not FINISHING[0]:
                    os._exit(0)
            time.sleep(0.05)

    _thread.start_new_thread(watch, ())  # a bare thread: never joined at exit, as a daemon


def main():
    # Keep the real stdout for protocol frames; point fd 1 at stderr so stray prints from
    # modules or their subprocesses cannot corrupt the stream.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = os.fdopen(os.dup(0), "rb")
    watchdog(inp.fileno(), os.getppid())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.exit(serve(inp, out))


if __name__ == "__main__" or __name__ == "fleetctl_agent":
    main()
