# fleetctl-include: model_files
# fleetctl-include: model_link
# One link of `fleetctl models sync`'s pipelined chain, run on each host by `python -c` (stream_main).
#
# Stdlib only, Python >= 3.8. stdin: a length-prefixed JSON plan, then (role "node"/"relay") the
# upstream's frames. Roles: "source" reads the files from plan["src"]; "node" lands the files it
# lacks under plan["dest"] (model_files' staging rules) and forwards frames while it writes them;
# "relay" (the controller, where hosts cannot reach each other) only forwards; "feed" (a source
# feeding the controller's relay) writes MAGIC + frames of plan["send"] to stdout and nothing else.
# Each node attaches its branches first (model_link.Branch: an ssh to the next host, whose own
# node attaches the rest), then answers "ready" with every file its subtree needs, so the source
# sends only those. Events go upstream on stdout as lines (EVENT + JSON): ready, progress, done,
# cut, refused; each node relays its branches' lines. A branch that dies or stalls is cut and the
# hosts behind it re-attached; the files they missed are sent from this host's disk at the end.
# Each file that lands verified is recorded in the host's verified-hash store (model_host.HashStore,
# plan["cache_dir"]) under the path it will have once published, so the deploy tier's first check
# after a sync hashes nothing again (publishing renames the folder: the files keep inode and times).
import json
import os
import select
import struct
import sys
import time

PROGRESS_EVERY = 0.5


class Upstream(object):
    """Frames from stdin, each read straight into a buffer of its own (header and payload, as it will
    be forwarded); an upstream silent for `stall` seconds counts as lost."""

    def __init__(self, stall):
        self.fd, self.stall = sys.stdin.fileno(), stall
        widen_pipe(self.fd)

    def fill(self, view):
        got = 0
        while got < len(view):
            ready, _, _ = select.select([self.fd], [], [], self.stall)
            if not ready:
                raise EOFError("upstream stalled for %ss" % self.stall)
            n = os.readv(self.fd, [view[got:]])
            if not n:
                raise EOFError("upstream closed the stream")
            got += n

    def frames(self):
        head = bytearray(5)
        while True:
            self.fill(memoryview(head))
            kind, size = bytes(head[:1]), struct.unpack(">I", bytes(head[1:]))[0]
            raw = bytearray(5 + size)
            raw[:5] = head
            self.fill(memoryview(raw)[5:])
            yield kind, raw
            if kind == ZEND:
                return


def controller_gone():
    """The source's stdin stays open while the controller lives: EOF means it was killed."""
    fd = sys.stdin.fileno()
    try:
        if select.select([fd], [], [], 0)[0]:
            return os.read(fd, 1 << 16) == b""
    except OSError:
        return True
    return False


def file_frames(src, files, indices, watch=False):
    """(kind, frame) of each file named by ``indices``, its blocks read straight into their frames."""
    for i in indices:
        rel = safe_rel(files[i][0])
        yield FILE, frame(FILE, str(i).encode())
        with open(os.path.join(src, rel), "rb", buffering=0) as handle:
            while True:
                raw = bytearray(5 + FRAME)
                n = handle.readinto(memoryview(raw)[5:])
                if not n:
                    break
                if n < FRAME:
                    del raw[5 + n:]
                raw[:5] = DATA + struct.pack(">I", n)
                if watch and controller_gone():
                    raise EOFError("the controller went away")
                yield DATA, raw
        yield END, frame(END, b"")
    yield ZEND, frame(ZEND, b"")


class Landing(object):
    """One file written to a temporary name in staging, hashed as it lands."""

    def __init__(self, dest, index, rel, size, sha):
        self.rel, self.size, self.sha = rel, size, sha
        self.tmp = os.path.join(temp_dir_of(dest), "%d.%d.part" % (index, os.getpid()))
        self.final = os.path.join(staging_of(dest), rel)
        self.handle = open(self.tmp, "wb")
        self.digest, self.got = hashlib.sha256(), 0

    def write(self, data):
        self.handle.write(data)
        self.digest.update(data)
        self.got += len(data)

    def finish(self):
        self.handle.close()
        if self.got != self.size or self.digest.hexdigest() != self.sha:
            os.unlink(self.tmp)
            return "%s: got %d bytes, sha256 %s; the manifest says %d bytes, %s" % (
                self.rel, self.got, self.digest.hexdigest()[:16], self.size, self.sha[:16])
        parent = os.path.dirname(self.final)
        if not os.path.isdir(parent):
            os.makedirs(parent)
        os.rename(self.tmp, self.final)
        return None

    def abandon(self):
        try:
            self.handle.close()
            os.unlink(self.tmp)
        except OSError:
            pass


def clear_stale_temps(dest):
    """Temporary files of syncs whose process is gone (killed mid-file)."""
    folder = temp_dir_of(dest)
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        parts = name.split(".")
        if len(parts) == 3 and parts[1].isdigit() and not os.path.exists("/proc/" + parts[1]):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


class Node(object):
    def __init__(self, plan, out):
        self.plan, self.out, self.me = plan, out, plan.get("host", "")
        self.files = plan["files"]
        self.role = plan["role"]
        self.dest = plan.get("dest")
        self.hf = plan.get("layout") == "hf_cache"
        self.own, self.landing, self.errors = set(), None, []
        self.store, self.locked = None, False
        self.written, self.cur, self.last = 0, -1, 0.0

    def prepare(self):
        """A node checks its own disk first: refused (foreign folder, no room) before any byte."""
        if self.role != "node":
            return True
        theirs = take_lock(self.dest, self.plan.get("holder") or {}, self.plan.get("stale_syncs") or ())
        if theirs is not None:
            self.out.event("refused", host=self.me, why="%s is %s" % (self.dest, holder_line(theirs)))
            return False
        self.locked = True
        params = {"dest": self.dest, "files": self.files, "manifest_name": self.plan["manifest_name"],
                  "links": self.plan.get("links")}
        found = hf_check(params) if self.hf else check_dest(params)
        if found.get("foreign"):
            self.out.event("refused", host=self.me, why=found.get("why") or (
                "%s exists and is not this model revision" % self.dest))
            return False
        if not found["complete"] and found["free"] < found["room_needed"]:
            self.out.event("refused", host=self.me, why="no room: %d bytes free on %s's volume, %d needed" % (
                found["free"], self.dest, found["room_needed"]))
            return False
        self.own = set(found["need"])
        if self.own:
            if not os.path.isdir(temp_dir_of(self.dest)):
                os.makedirs(temp_dir_of(self.dest))
            clear_stale_temps(self.dest)
            if self.plan.get("cache_dir"):
                self.store = HashStore(self.plan["cache_dir"], os.path.realpath(self.dest))
        return True

    def record(self, path, key, sha):
        """A proved file's hash, as of its stat now, under the real path ``key`` verify will see."""
        if self.store is None:
            return
        st = os.stat(path)
        self.store.files[key] = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, sha, time.time()]
        self.store.changed = True
        self.store.save()  # per file: a killed sync keeps what it proved

    def landed(self, landing):
        """A folder's file keeps its inode and times when staging becomes dest: recorded now. A HF blob
        is renamed into blobs/ at publish (a new ctime): recorded then (publish_model)."""
        if not self.hf:
            self.record(landing.final, os.path.join(self.store.base if self.store else "", landing.rel), landing.sha)

    def publish_model(self):
        if not self.hf:
            return publish(self.dest, self.files, self.plan["manifest_name"], self.plan["manifest_text"])
        return hf_publish(self.dest, self.files, self.plan["links"], self.plan["manifest_text"],
                          lambda path, sha: self.record(path, os.path.realpath(path), sha))

    def local_path(self, i):
        rel = safe_rel(self.files[i][0])
        if self.role == "source":
            return os.path.join(self.plan["src"], rel)
        if staged(self.dest, rel, self.files[i][1]):
            return os.path.join(staging_of(self.dest), rel)
        return os.path.join(hf_dirs(self.dest)[1] if self.hf else self.dest, rel)

    def on_frame(self, kind, raw):
        payload = memoryview(raw)[5:]
        if kind == FILE:
            self.cur = int(bytes(payload))
            if self.cur in self.own and not self.errors_full():
                rel, size, sha = self.files[self.cur]
                self.landing = Landing(self.dest, self.cur, safe_rel(rel), size, sha)
        elif kind == DATA and self.landing is not None:
            try:
                self.landing.write(payload)
            except (IOError, OSError) as exc:  # a full disk stops this host, not the chain
                self.errors.append("writing %s: %s" % (self.landing.rel, exc))
                self.landing.abandon()
                self.landing = None
            self.written += len(payload)
            self.progress()
        elif kind == END and self.landing is not None:
            why = self.landing.finish()
            if why:
                self.errors.append(why)
            else:
                self.landed(self.landing)
            self.landing = None

    def errors_full(self):
        return bool(self.errors) and "No space" in self.errors[-1]

    def progress(self, force=False):
        now = time.time()
        if force or now - self.last >= PROGRESS_EVERY:
            self.last = now
            self.out.event("progress", host=self.me, bytes=self.written)

    def finish(self):
        if self.role != "node":
            return
        if self.landing is not None:
            self.landing.abandon()
        self.progress(force=True)
        try:
            ok = self.publish_model()
        except (IOError, OSError) as exc:
            ok, self.errors = False, self.errors + ["publishing: %s" % exc]
        missing = [self.files[i][0] for i in sorted(self.own) if not staged(self.dest, self.files[i][0],
                                                                            self.files[i][1])]
        self.out.event("done", host=self.me, ok=ok, written=self.written, errors=self.errors[:5],
                       missing=[] if ok else missing[:5])


def run(plan):
    node = Node(plan, Out())
    try:
        return run_node(plan, node, node.out)
    finally:
        if node.locked:
            release_lock(node.dest)


def run_node(plan, node, out):
    if not node.prepare():
        return 0
    stall = float(plan.get("stall_s") or 60)
    branches = [Branch(c, plan, out, stall) for c in plan.get("branches") or []]
    for branch in branches:
        branch.attach()
    need = set(node.own)
    for branch in branches:
        need |= branch.need
    out.event("ready", host=node.me, need=sorted(need))
    if node.role == "source":
        frames = file_frames(plan["src"], node.files, sorted(need), watch=True)
    else:
        frames = Upstream(stall).frames()
    sent = 0
    lander = Lander(node.on_frame, node.errors.append) if node.own else None
    cur = -1
    try:
        for kind, raw in frames:
            if lander is not None:
                lander.put(kind, raw)  # landed beside the forwarding, in order
            else:
                node.on_frame(kind, raw)
            if kind == ZEND:
                break
            if kind == FILE:
                cur = int(bytes(raw[5:]))
            for branch in branches:
                sent += branch.forward(kind, raw, cur)
    except EOFError as exc:  # upstream lost: nothing half-written stays; the branches see EOF too
        if lander is not None:
            lander.close()
        if node.landing is not None:
            node.landing.abandon()
        for branch in branches:
            branch.close()
        out.event("lost", host=node.me, why=str(exc))
        return 1
    if lander is not None:
        lander.close()  # every file landed: the catch-up below reads them from this disk
    for branch in branches:
        sent += branch.catch_up(node.local_path)
        branch.end()
    node.finish()
    if node.role in ("source", "relay"):
        out.event("sent", host=node.me, bytes=sent)
    for branch in branches:
        branch.wait()
    return 0


def feed(plan):
    """The source side of a controller relay: frames only, on stdout."""
    write = sys.stdout.buffer.write
    write(MAGIC)
    for _, raw in file_frames(plan["src"], plan["files"], plan["send"], watch=True):
        write(raw)
    sys.stdout.buffer.flush()
    return 0


def stream_main():
    stdin = sys.stdin.fileno()
    size = struct.unpack(">I", read_exact(stdin, 4))[0]
    plan = json.loads(read_exact(stdin, size).decode("utf-8"))
    sys.exit(feed(plan) if plan["role"] == "feed" else run(plan))


def read_exact(fd, n):
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError("the plan was cut short")
        data += chunk
    return data


if __name__ == "__main__":
    try:
        stream_main()
    except BaseException as exc:  # the upstream reads the reason from stderr
        if isinstance(exc, SystemExit):
            raise
        sys.stderr.write("model_chain: %s: %s\n" % (type(exc).__name__, exc))
        sys.exit(1)
