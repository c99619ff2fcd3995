# The links of `fleetctl models sync`'s chain: the frame format, the event lines sent upstream, and
# Branch, one downstream host reached over the host's own ssh (its key checked against this host's
# known_hosts, StrictHostKeyChecking=yes: the argv comes from the controller).
#
# Stdlib only, Python >= 3.8. Included by model_chain.
import fcntl
import hashlib
import json
import os
import queue
import select
import struct
import subprocess
import sys
import threading
import time

MAGIC = b"\x00FLEETCTL-MODEL-1\n"
EVENT = b"@@FLEETCTL-EV "
FILE, DATA, END, ZEND = b"F", b"D", b"E", b"Z"
FRAME = 1 << 20
BEAT = 1.0  # seconds: a blocked sender says so this often, so the hosts before it keep waiting
PIPE_SIZE = 1 << 20  # the pipes on each side of a node hold a whole frame: one wakeup per frame, not 16
F_SETPIPE_SZ = 1031
LAND_DEPTH = 32  # frames (MB) a node may hold for its own disk while it keeps forwarding
HOLD_PROGRESS = 0.25  # seconds a hop holds its branch's progress lines to send them on in one write


def frame(kind, payload):
    return kind + struct.pack(">I", len(payload)) + payload


def widen_pipe(fd):
    """A pipe of PIPE_SIZE (Linux; the system's pipe-max-size caps it; elsewhere, or not a pipe: as is)."""
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
    except (IOError, OSError, ValueError):
        pass


class Lander(object):
    """A node's own landing (write + sha256 of each frame) in a thread of its own, behind a bounded
    queue: a disk write that blocks a moment does not hold up the hosts behind this one (the file
    write and the hash release the GIL, so both run beside the forwarding). Frames land in order."""

    def __init__(self, handle, failed):
        self.handle, self.failed = handle, failed
        self.queue = queue.Queue(LAND_DEPTH)
        self.thread = threading.Thread(target=self.loop)
        self.thread.daemon = True
        self.thread.start()

    def put(self, kind, raw):
        self.queue.put((kind, raw))

    def loop(self):
        broken = False
        while True:
            item = self.queue.get()
            if item is None:
                return
            if broken:
                continue  # keep taking frames: the forwarding never waits on a dead lander
            try:
                self.handle(*item)
            except Exception as exc:  # noqa - said in the host's done line, the chain goes on
                self.failed("landing: %s: %s" % (type(exc).__name__, exc))
                broken = True

    def close(self):
        self.queue.put(None)
        self.thread.join()


class Out(object):
    """Event lines to stdout, one writer at a time; a vanished upstream is not an error here."""

    def __init__(self):
        self.lock, self.gone = threading.Lock(), False

    def line(self, raw):
        with self.lock:
            if self.gone:
                return
            try:
                sys.stdout.buffer.write(raw)
                sys.stdout.buffer.flush()
            except (IOError, OSError):
                self.gone = True

    def event(self, kind, **fields):
        fields["ev"] = kind
        self.line(EVENT + json.dumps(fields).encode("utf-8") + b"\n")


class Cut(Exception):
    pass


class Lines(object):
    """Lines of a child's stdout, with a deadline."""

    def __init__(self, fd):
        self.fd, self.buf = fd, b""

    def readline(self, timeout):
        deadline = None if timeout is None else time.time() + timeout
        while b"\n" not in self.buf:
            left = None if deadline is None else max(0.0, deadline - time.time())
            if not select.select([self.fd], [], [], left)[0]:
                raise Cut("no answer within %ds" % timeout)
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line + b"\n"


def parse_event(line):
    if not line.startswith(EVENT):
        return None  # sudo's STARTED, a login banner: not ours
    try:
        return json.loads(line[len(EVENT):].decode("utf-8"))
    except ValueError:
        return None


class Branch(object):
    """The next host of the chain (candidates[0]), the others behind it; re-attached past a cut."""

    def __init__(self, candidates, plan, out, stall):
        self.candidates, self.plan, self.out, self.stall = list(candidates), plan, out, stall
        self.proc, self.host, self.need, self.deferred = None, None, set(), set()
        self.skip, self.forwarding, self.relay = -1, False, None
        self.limit = float(plan.get("limit_rate") or 0)
        self.next_at, self.child_blocked = 0.0, 0.0

    def spawn(self, entry, rest):
        argv = list(entry["argv"])
        key = (self.plan.get("keys") or {}).get(self.plan.get("host", ""))
        if key and argv[:1] == ["ssh"]:
            argv[1:1] = ["-o", "IdentitiesOnly=yes", "-i", key]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        widen_pipe(proc.stdin.fileno())
        child = dict(self.plan, role="node", host=entry["host"], cache_dir=entry.get("cache_dir"),
                     branches=[rest] if rest else [])
        body = json.dumps(child).encode("utf-8")
        try:
            proc.stdin.write(struct.pack(">I", len(body)) + body)
            proc.stdin.flush()
        except (IOError, OSError):
            pass
        return proc

    def attach(self):
        """The first candidate that answers ready; each one that does not is cut, with why."""
        while self.candidates:
            entry = self.candidates.pop(0)
            proc = self.spawn(entry, self.candidates)
            lines = Lines(proc.stdout.fileno())
            why = None
            try:
                while True:
                    line = lines.readline(60 + 15 * len(self.candidates))
                    if line is None:
                        why = self.stderr_of(proc) or "its stream ended before it was ready"
                        break
                    ev = parse_event(line)
                    if ev is not None and ev.get("ev") == "ready" and ev.get("host") == entry["host"]:
                        self.proc, self.host, self.need = proc, entry["host"], set(ev.get("need") or [])
                        self.relay = threading.Thread(target=self.pass_up, args=(lines,))
                        self.relay.daemon = True
                        self.relay.start()
                        flags = fcntl.fcntl(proc.stdin.fileno(), fcntl.F_GETFL)
                        fcntl.fcntl(proc.stdin.fileno(), fcntl.F_SETFL, flags | os.O_NONBLOCK)
                        return True
                    if ev is not None and ev.get("ev") == "refused" and ev.get("host") == entry["host"]:
                        self.out.line(line)  # its own one line, already said
                        why = ""
                        break
                    if ev is not None:
                        self.out.line(line)
            except Cut as exc:
                why = str(exc)
            self.kill(proc)
            if why:
                self.out.event("cut", host=entry["host"], by=self.plan.get("host", ""), why=why, stage="attach")
        return False

    def stderr_of(self, proc):
        self.kill(proc)
        try:
            text = proc.stderr.read().decode("utf-8", "replace").strip()
        except (IOError, OSError):
            text = ""
        return text.splitlines()[-1] if text else ""

    def kill(self, proc):
        if proc.poll() is None:
            try:
                proc.kill()
            except OSError:
                pass
        try:
            proc.wait(5)
        except Exception:
            pass

    def pass_up(self, lines):
        """Relay the branch's event lines upstream. Progress lines are held up to HOLD_PROGRESS seconds
        (the latest per host) and sent on together: every host's progress crosses every hop before it,
        so one write per line would cost each hop N writes and wakeups a second, the chain N squared."""
        held, since = {}, 0.0
        while True:
            try:
                line = lines.readline(max(0.0, since + HOLD_PROGRESS - time.time()) if held else None)
            except Cut:  # held long enough
                self.out.line(b"".join(held.values()))
                held = {}
                continue
            except OSError:
                line = None
            if line is None:
                if held:
                    self.out.line(b"".join(held.values()))
                return
            if line.startswith(EVENT) and line.endswith(b'"ev": "progress"}\n'):
                if not held:
                    since = time.time()
                held[line.split(b', "bytes"', 1)[0]] = line
                continue
            if b'"blocked"' in line:
                ev = parse_event(line)
                if ev is not None and ev.get("ev") == "blocked":
                    if ev.get("host") == self.host:  # the next host waits on its own next one
                        self.child_blocked = time.time()
                    continue
            if line.startswith(EVENT):  # in order: the progress held so far, then this line
                self.out.line(b"".join(held.values()) + line)
                held = {}

    def forward(self, kind, raw, cur):
        """Send one frame (``raw``: as it came, header and payload) on if this branch's subtree needs it;
        the bytes sent."""
        if self.proc is None:
            return 0
        if kind == FILE:
            self.forwarding = cur in self.need and cur != self.skip
        if not self.forwarding:
            return 0
        try:
            return self.send(raw)
        except Cut as exc:
            self.cut(str(exc), cur)
            return 0

    def send(self, data):
        """Write one frame; a next host that takes nothing for `stall` seconds is stalled, unless it
        says it is itself waiting on the host after it (then that one is cut, further down)."""
        if self.limit > 0:
            now = time.time()
            self.next_at = max(self.next_at, now) + len(data) / self.limit
            if self.next_at - now > 0.001:
                time.sleep(self.next_at - now)
        fd, view, waited = self.proc.stdin.fileno(), memoryview(data), 0.0
        while view:
            if not select.select([], [fd], [], BEAT)[1]:
                waited += BEAT
                self.out.event("blocked", host=self.plan.get("host", ""), on=self.host)
                # a next host that said it waits on its own next one gets a whole stall period of
                # silence before it is judged: its own cut comes first (a busy host's word can be late)
                if waited >= self.stall and time.time() - self.child_blocked > max(3 * BEAT, self.stall):
                    raise Cut("stalled: took nothing for %ss" % self.stall)
                continue
            try:
                n = os.write(fd, view)
            except (IOError, OSError) as exc:
                raise Cut("its stream broke: %s" % (self.stderr_of(self.proc) or exc))
            view, waited = view[n:], 0.0
        return len(data)

    def cut(self, why, cur):
        """Cut the next host out; the hosts behind it are attached here. Files up to `cur` passed
        them by: they are sent from this host's disk after the stream ends."""
        host = self.host
        self.kill(self.proc)
        self.proc, self.forwarding = None, False
        self.out.event("cut", host=host, by=self.plan.get("host", ""), why=why, stage="stream")
        if self.attach():
            self.deferred = set(i for i in self.need if i <= cur)
            self.skip = cur

    def catch_up(self, local_path):
        sent = 0
        for i in sorted(self.deferred):
            if self.proc is None:
                break
            try:
                sent += self.send(frame(FILE, str(i).encode()))
                with open(local_path(i), "rb") as handle:
                    while True:
                        block = handle.read(FRAME)
                        if not block:
                            break
                        sent += self.send(frame(DATA, block))
                sent += self.send(frame(END, b""))
            except (Cut, IOError, OSError) as exc:
                self.kill(self.proc)
                self.out.event("cut", host=self.host, by=self.plan.get("host", ""), why=str(exc), stage="catch-up")
                self.proc = None
        return sent

    def end(self):
        if self.proc is None:
            return
        try:
            self.send(frame(ZEND, b""))
        except Cut:
            pass
        self.close()

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except (IOError, OSError):
                pass

    def wait(self):
        if self.relay is not None:
            self.relay.join()
        if self.proc is not None:
            self.proc.wait()


__all__ = ["hashlib"]  # model_chain, which includes this module, hashes with it
