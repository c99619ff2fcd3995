"""Follows a host's server logs for ``fleetctl logs --follow``: a process of its own, on its own channel.

Stdlib only, Python >= 3.8. ``stream_main({"sources": [{"label": NAME|None, "argv": [...]}]})`` runs
each source's follower (``tail -F ...`` or ``journalctl -f ...``, from ``service_host`` op logs with
``follow``) and writes one JSON document per line on stdout: ``{"i": label, "l": line}`` for a log
line, ``{"i": label, "end": why}`` when a source's follower ended. It stops, ending its followers,
when stdin gives anything or closes (the controller stopped: Ctrl-C, or its connection went), on
SIGTERM/SIGHUP, or when stdout is gone. Followers die with it even when it is killed (PDEATHSIG).
"""

import json
import os
import select
import signal
import subprocess
import sys


class Stop(Exception):
    """Time to end every follower and exit."""


def stream_main(params):
    out = sys.stdout.buffer
    children = {}  # stdout fd -> [label, proc, partial line]
    for handler_sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(handler_sig, raise_stop)
    try:
        for source in params.get("sources") or []:
            start(source, children, out)
        while children:
            pump(children, out)
    except (Stop, IOError, OSError):
        pass
    finally:
        end_all(children)


def raise_stop(_sig, _frame):
    raise Stop()


def die_with_parent():
    """The follower gets SIGTERM when we die, however we die (Linux; elsewhere best effort)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def start(source, children, out):
    label, argv = source.get("label"), [str(a) for a in source["argv"]]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                close_fds=True, preexec_fn=die_with_parent)
    except OSError as exc:
        emit(out, {"i": label, "end": "cannot run %s: %s" % (argv[0], exc.strerror or exc)})
        return
    children[proc.stdout.fileno()] = [label, proc, b""]


def pump(children, out):
    ready, _, _ = select.select([0] + list(children), [], [])
    for fd in ready:
        if fd == 0:
            raise Stop()  # anything on stdin, or its end, means stop
        entry = children[fd]
        data = os.read(fd, 65536)
        if not data:
            del children[fd]
            rc = entry[1].wait()
            if entry[2]:
                emit(out, {"i": entry[0], "l": decode(entry[2])})
            tail_text = "" if rc == 0 else " (exit %d)" % rc
            emit(out, {"i": entry[0], "end": "%s ended%s" % (entry[1].args[0], tail_text)})
            continue
        complete = (entry[2] + data).split(b"\n")
        entry[2] = complete.pop()
        for raw in complete:
            emit(out, {"i": entry[0], "l": decode(raw)}, flush=False)
        out.flush()


def decode(raw):
    return raw.decode("utf-8", "replace").rstrip("\r")


def emit(out, doc, flush=True):
    out.write((json.dumps(doc) + "\n").encode("utf-8"))
    if flush:
        out.flush()


def end_all(children):
    """TERM each follower, KILL one that lingers, and reap them all: none is left on the host."""
    for _label, proc, _rest in children.values():
        try:
            proc.terminate()
        except OSError:
            pass
    for _label, proc, _rest in children.values():
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    children.clear()
