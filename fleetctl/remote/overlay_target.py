# fleetctl-include: relocate
# fleetctl-include: venvinfo
# fleetctl-include: writable
# The target side of `fleetctl venv overlay`, run by the target venv's own python.
#
# Stdlib only, Python >= 3.8. Two entry points:
#   main({"action": "list", "names": [dist], "trees": {name: [dist_info, tree]}}) (an agent call,
#     read-only): this interpreter, every dist-info of those distributions, whether it matches
#     the source's tree hash, and the RECORD paths of those that do not (zlib+base64 packed).
#     With {"own_trees": true, "packages": [glob]} instead: each dist-info's own tree hash (run
#     while the source lists; the controller compares).
#   main({"action": "hashes", "paths_z": packed [rel]}): the sha256 of each path that exists (of a
#     dist-info's RECORD: comparable_record_hash, its rows without bytecode, as the source sends it).
#   stream_main() (`python -c`, over its own exec channel): reads one length-prefixed JSON plan
#     from stdin, then the zlib-compressed tar the source streams, and applies it in an order
#     that a dropped connection cannot turn into a hybrid (see apply()). Prints one delimited
#     JSON answer on stdout. With a "direct" entry in the plan the target does not read the tar
#     from stdin: it runs the given ssh argv itself (the source host's own overlay_source stream
#     command), sends it the source's params and reads the framed stream from its stdout.
import base64
import contextlib
import email.parser
import errno
import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zlib
from stat import S_ISREG

BEGIN = "@@FLEETCTL-JSON-BEGIN@@"
END = "@@FLEETCTL-JSON-END@@"
STATE_DIR = "/var/lib/fleetctl/overlays"
STREAM_MAGIC = b"\x00FLEETCTL-OVERLAY-1\n"
PYC_TAG = re.compile(r"^[a-z]+-\d+(\.opt-\d+)?\.pyc$")  # "cpython-311.pyc", "cpython-311.opt-1.pyc"


def listing(params):
    """Each dist-info of `names`; `match` when it is the source's dist-info and the tree hash over
    the files its RECORD lists equals the source's (then its file list is left out).
    With `own_trees` (and `packages` globs instead of names) it runs before the source's listing
    has come: each dist-info's own tree hash, no file lists; the controller compares."""
    info = interpreter()
    site, names, trees = info["site"], set(params.get("names") or []), params.get("trees") or {}
    own, patterns = bool(params.get("own_trees")), params.get("packages") or []
    cache = HashCache(user_cache_dir(params.get("cache_dir") or "/var/lib/fleetctl/cache", "cache"), info["prefix"])
    dists = {}
    for entry in sorted(os.listdir(site)) if os.path.isdir(site) else []:
        folder = os.path.join(site, entry)
        if not (entry.endswith(".dist-info") and os.path.isdir(folder)):
            continue
        name, version = dist_name(folder, entry)
        if not (wanted(normalize(name), patterns) if own else normalize(name) in names):
            continue
        rows = [os.path.normpath(row[0]) for row in read_record(folder) if not is_bytecode(row[0])]
        item = {"version": version, "dist_info": entry}
        if own:
            item["tree"] = tree_of(site, entry, rows, cache)
        else:
            want = trees.get(normalize(name))
            item["match"] = bool(want and want[0] == entry and tree_of(site, entry, rows, cache) == want[1])
            if not item["match"]:
                item["files_z"] = pack_json(rows)
        dists.setdefault(normalize(name), []).append(item)
    cache.save()
    return {"schema": 1, "interpreter": info, "dists": dists,
            "inflight": os.path.exists(journal_path(info["prefix"], params.get("state_dir")))}


def tree_of(site, entry, rows, cache):
    """The tree hash over the files `rows` lists, as overlay_source computes it for what it would
    send: RECORD by its rows (comparable_record_hash), not its bytes."""
    entries = []
    for rel in rows:
        if rel == entry + "/RECORD":
            continue
        digest = cached_hash(cache, os.path.join(site, rel))
        if digest is None:
            return None
        entries.append((rel, digest))
    entries.append((entry + "/RECORD", comparable_record_hash(os.path.join(site, entry))))
    return tree_hash(entries)


def hashes(params):
    """sha256 of each RECORD path in `paths_z` (None when absent), packed."""
    info = interpreter()
    cache = HashCache(user_cache_dir(params.get("cache_dir") or "/var/lib/fleetctl/cache", "cache"), info["prefix"])
    out = {}
    for rel in unpack_json(params.get("paths_z")) or []:
        path = os.path.normpath(os.path.join(info["site"], rel))
        parts = rel.split("/")
        if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "RECORD":
            out[rel] = comparable_record_hash(os.path.dirname(path))  # by its rows, as the source's
        else:
            out[rel] = cached_hash(cache, path)
    cache.save()
    return {"hashes_z": pack_json(out)}


def cached_hash(cache, path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not S_ISREG(st.st_mode):  # the stat at hand, not a second one (once per file of the venv)
        return None
    hit = cache.lookup(path, st)
    if hit:
        return hit[0]
    digest = file_hash(path)[7:]
    cache.store(path, st, digest, None)
    return digest


def main(params):
    params = params or {}
    if params.get("action", "list") == "list":
        return listing(params)
    if params.get("action") == "hashes":
        return hashes(params)
    raise ValueError("unknown action %r" % params.get("action"))


def journal_path(prefix, state_dir=None):
    key = hashlib.sha256(prefix.encode("utf-8")).hexdigest()[:16]
    return os.path.join(state_dir or STATE_DIR, "inflight-%s.json" % key)


class Decompressor(object):
    """A read-only file object over `read(n)` (stdin, or a direct source): what tarfile reads,
    zlib-decompressed when the source compressed it (`compressed`), else as it came."""

    def __init__(self, read, compressed=True):
        self.raw, self.buf, self.bytes_in = read, bytearray(), 0
        self.z = zlib.decompressobj() if compressed else None

    def fill(self):
        chunk = self.raw(1 << 20)
        if not chunk:
            raise EOFError("the stream from the source ended early (connection dropped?)")
        self.bytes_in += len(chunk)
        self.buf += self.z.decompress(chunk) if self.z is not None else chunk

    def ended(self):
        # Uncompressed, the tar's own end-of-archive blocks are the end (tarfile has read them).
        return self.z is None or self.z.eof

    def read(self, size=-1):
        if self.z is None:  # as it came: what has arrived (tarfile asks again), never wait for more
            if not self.buf and size != 0:
                self.fill()
        else:
            while (size < 0 or len(self.buf) < size) and not self.z.eof:
                self.fill()
        size = len(self.buf) if size < 0 else size
        out = bytes(self.buf[:size])
        del self.buf[:size]  # deleting from the front of a bytearray is O(1) in CPython
        return out

    def finish(self):
        while not self.ended():
            self.fill()


class HashingReader(object):
    """A file object's bytes as they are copied, with their sha256 (RECORD's urlsafe form)."""

    def __init__(self, content):
        self.content, self.h = content, hashlib.sha256()

    def read(self, size=-1):
        data = self.content.read(size)
        self.h.update(data)
        return data

    def digest(self):
        return base64.urlsafe_b64encode(self.h.digest()).rstrip(b"=").decode("ascii")


class ChangedAtSource(IOError):
    """A file's bytes differ from the hash the source's listing gave: it changed mid-overlay."""


class Applier(object):
    """Applies one plan in a crash-safe order; every step can be redone by a re-run."""

    def __init__(self, plan):
        self.plan = plan
        self.info = interpreter()
        self.site, self.prefix = self.info["site"], self.info["prefix"]
        self.journal = journal_path(self.prefix, plan.get("state_dir"))
        self.written, self.removed, self.meta = 0, 0, []
        # What the source listed for each file: a landed file is checked against it, and its hash
        # goes into this host's overlay hash cache (the next listing of it then only stats it).
        self.expected = dict((os.path.normpath(rel), digest) for d in (plan.get("manifest") or {}).get("dists", [])
                             for rel, digest in d.get("files", {}).items())
        self.cache = HashCache(user_cache_dir(plan.get("cache_dir") or "/var/lib/fleetctl/cache", "cache"),
                               self.prefix)

    def path(self, rel, strict=True):
        path = os.path.normpath(os.path.join(self.site, rel))
        if not path.startswith(self.prefix + "/"):
            if not strict:
                return None
            raise ValueError("refusing %r: it would land outside %s" % (rel, self.prefix))
        return path

    def begin(self):
        """Clear what an interrupted run left (temp files, a renamed dist-info), note this run's."""
        self.clear_leftovers()
        temps = [temp_name(self.path(rel)) for rel in self.plan["expect"]]
        temps += [temp_name(os.path.join(self.site, d)) for d in self.plan["remove_dist_infos"]]
        os.makedirs(os.path.dirname(self.journal), exist_ok=True)
        atomic_write(self.journal, json.dumps({"temps": temps}).encode("utf-8"))

    def clear_leftovers(self):
        try:
            with open(self.journal, "r") as handle:
                temps = json.load(handle).get("temps", [])
        except (IOError, OSError, ValueError):
            return
        for temp in temps:
            if os.path.isdir(temp) and not os.path.islink(temp):
                shutil.rmtree(temp, ignore_errors=True)
            elif os.path.lexists(temp):
                os.unlink(temp)

    def land(self, member, content):
        """`content`: the member's file object; a dist-info file is read whole (it is written last),
        any other is copied to its temporary name in chunks (a 1 GB library is never held whole)."""
        rel = os.path.normpath(member.name)
        path = self.path(rel)
        if rel.split("/", 1)[0].endswith(".dist-info"):
            self.meta.append((rel, path, content.read(), member.mode, member.mtime))  # written last, see apply()
            return
        hashing = HashingReader(content)
        tmp = write_temp(path, hashing, member.mode, member.mtime)
        digest, want = hashing.digest(), self.expected.get(rel)
        if want is not None and digest != want:
            discard(tmp)
            raise ChangedAtSource("%s arrived with sha256 %s, not the %s the source listed: it changed on the "
                                  "source during the transfer; run again" % (rel, digest, want))
        try:
            os.replace(tmp, path)
        except BaseException:
            discard(tmp)
            raise
        self.cache.store(path, os.stat(path), digest, None)
        drop_bytecode(path)
        self.written += 1
        if self.plan.get("throttle_s"):
            time.sleep(float(self.plan["throttle_s"]))

    def remove_old_files(self):
        folders = set()
        for rel in self.plan["remove"]:
            path = self.path(rel, strict=False)
            if path is None:  # an old RECORD row pointing outside the venv: not ours to delete
                continue
            if os.path.lexists(path) and not os.path.isdir(path):
                os.unlink(path)
                self.removed += 1
            drop_bytecode(path)
            folders.add(os.path.dirname(path))
        prune_empty(folders, self.site)

    def replace_dist_info(self):
        """Old dist-info folders go (renamed away first, so none is ever half there), then the
        new one is written, RECORD last: a re-run that finds it missing or partial redoes it."""
        keep = self.plan.get("new_dist_infos") or {}  # new dist-info -> every file its RECORD lists
        for entry in self.plan["remove_dist_infos"]:
            folder = os.path.join(self.site, entry)
            if entry in keep:  # the same folder stays: only files the new RECORD does not list go
                listed = set(keep[entry])
                for name in os.listdir(folder) if os.path.isdir(folder) else []:
                    if entry + "/" + name not in listed and os.path.isfile(os.path.join(folder, name)):
                        os.unlink(os.path.join(folder, name))
                continue
            if os.path.isdir(folder):
                os.rename(folder, temp_name(folder))
                shutil.rmtree(temp_name(folder))
        self.meta.sort(key=lambda item: (item[0].split("/", 1)[0], item[0].endswith("/RECORD"), item[0]))
        for _rel, path, data, mode, mtime in self.meta:
            atomic_write(path, data, mode, mtime)
            self.written += 1


def drop_bytecode(path):
    """A replaced or removed module's cached bytecode goes with it (as pip's uninstall does)."""
    if not path.endswith(".py"):
        return
    cache = os.path.join(os.path.dirname(path), "__pycache__")
    stem = os.path.basename(path)[:-3] + "."
    for name in os.listdir(cache) if os.path.isdir(cache) else []:
        if name.startswith(stem) and PYC_TAG.match(name[len(stem):]):
            os.unlink(os.path.join(cache, name))


def prune_empty(folders, site):
    """Remove folders left empty (and their empty __pycache__), deepest first, never site itself."""
    for folder in sorted(folders, key=len, reverse=True):
        while folder.startswith(site + "/"):
            cache = os.path.join(folder, "__pycache__")
            if os.path.isdir(cache) and not os.listdir(cache):
                os.rmdir(cache)
            if not os.path.isdir(folder) or os.listdir(folder):
                break
            os.rmdir(folder)
            folder = os.path.dirname(folder)


def write_manifest(plan, applier):
    """The overlay manifest, and this venv's origins index that `fleetctl drift` reads."""
    manifest = dict(plan["manifest"])
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for dist in manifest["dists"]:
        record = os.path.join(applier.site, dist["dist_info"], "RECORD")
        with open(record, "rb") as handle:
            dist["record_sha256"] = hashlib.sha256(handle.read()).hexdigest()
    state = plan.get("state_dir") or STATE_DIR
    name = "%s-%s-%s.json" % (stamp, re.sub(r"[^A-Za-z0-9_.-]", "_", manifest["source_host"]), os.getpid())
    path = os.path.join(state, name)
    atomic_write(path, json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8"))
    index_path = os.path.join(state, "origins-%s.json" % hashlib.sha256(applier.prefix.encode()).hexdigest()[:16])
    try:
        with open(index_path, "r") as handle:
            index = json.load(handle)
    except (IOError, OSError, ValueError):
        index = {"venv": applier.prefix, "dists": {}}
    for dist in manifest["dists"]:
        index["dists"][dist["name"]] = {
            "source_host": manifest["source_host"], "source_venv": manifest["source_venv"],
            "time": manifest["time"], "version": dist["version"], "dist_info": dist["dist_info"],
            "record_sha256": dist["record_sha256"], "manifest": path}
    atomic_write(index_path, json.dumps(index, indent=1, sort_keys=True).encode("utf-8"))
    return path


class DirectError(Exception):
    """The source host could not be reached from here: nothing was written."""


class DirectSource(object):
    """The source's stream pulled over this host's own ssh: `argv` runs the source's stream
    command there; the bytes read() returns are the frames' payloads, as the controller would
    have forwarded them."""

    def __init__(self, direct):
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(direct["argv"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errors)
        self.buf, self.left, self.done = bytearray(), 0, False
        body = json.dumps(direct["params"]).encode("utf-8")
        try:
            self.proc.stdin.write(struct.pack(">I", len(body)) + body)
            self.proc.stdin.close()
        except (IOError, OSError):
            pass  # ssh already gone: the reason is on its stderr, read below

    def stderr(self):
        self.errors.seek(0)
        return self.errors.read().decode("utf-8", "replace")

    def why(self):
        """ssh's reason, one line: the line that says what failed, else its last line."""
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        lines = [line.strip().rstrip(".") for line in self.stderr().splitlines() if line.strip()]
        for key in ("Host key verification failed", "Permission denied", "Connection refused", "Could not resolve",
                    "timed out", "No route to host", "Identity file"):
            for line in lines:
                if key in line:
                    return line
        return lines[-1] if lines else "ssh exited with status %s" % self.proc.returncode

    def more(self):
        chunk = self.proc.stdout.read1(1 << 18)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def start(self):
        """Wait for the source's magic: until then ssh may still fail, and nothing is written."""
        while STREAM_MAGIC not in self.buf:
            if len(self.buf) > 1 << 16 or not self.more():
                raise DirectError(self.why())
        self.buf = self.buf[self.buf.index(STREAM_MAGIC) + len(STREAM_MAGIC):]

    def exact(self, n):
        while len(self.buf) < n:
            if not self.more():
                tail = self.stderr().strip()
                raise EOFError("the stream from the source ended early" + (" (%s)" % tail[-500:] if tail else ""))
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read(self, n):
        while self.left == 0:
            if self.done:
                return b""
            self.left = struct.unpack(">I", self.exact(4))[0]
            self.done = self.left == 0
        if not self.buf and not self.more():
            return self.exact(1)  # raises, with the source's reason
        out = bytes(self.buf[:min(n, self.left)])
        del self.buf[:len(out)]
        self.left -= len(out)
        return out

    def close(self):
        for handle in (self.proc.stdout, self.errors):
            handle.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class DiskFull(Exception):
    """The target venv's filesystem, or the state folder (journal, manifest), filled up."""


@contextlib.contextmanager
def state_full_said(applier, what, after, remove=None):
    """A full state folder while ``what`` is written: one line saying where, what, and what holds;
    ``remove`` (a file) goes first."""
    try:
        yield
    except (IOError, OSError) as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        if remove and os.path.lexists(remove):
            os.unlink(remove)
        raise DiskFull("no space left on device in %s (writing %s); %s"
                       % (os.path.dirname(applier.journal), what, after))


def apply(plan, read):
    """1. note temp names in a journal; 2. new files land (temp + rename) as the stream brings
    them; 3. old files the new RECORD no longer lists are removed; 4. old dist-info removed, new
    dist-info written, RECORD last; 5. manifest; 6. journal removed."""
    started = time.time()
    applier = Applier(plan)
    # Everything this run writes, checked before the journal (its first write) exists.
    require_writable([[applier.site, "the venv's site-packages", None],
                      [os.path.join(applier.prefix, "bin"), "the venv's scripts", None],
                      [os.path.dirname(applier.journal), "overlay journal and manifests", "fleetctl_state_dir"]])
    with state_full_said(applier, "the overlay journal", "nothing written to %s: run again when there is room"
                         % applier.prefix):
        applier.begin()
    source = Decompressor(read, int(plan.get("level", 1)) > 0)
    received = set()
    member = None
    try:
        with tarfile.open(fileobj=source, mode="r|", bufsize=1 << 20) as tar:
            for member in tar:
                if member.isfile():
                    applier.land(member, tar.extractfile(member))
                    received.add(os.path.normpath(member.name))
        source.finish()
    except (IOError, OSError) as exc:
        applier.cache.save()  # what landed whole is known, whatever stopped the rest
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        applier.clear_leftovers()  # the journal stays: the next run knows this one did not finish
        raise DiskFull("no space left on device in %s (writing %s); temporary files removed, %d files written "
                       "(each whole), the old dist-info still in place: run again when there is room"
                       % (applier.prefix, member.name if member is not None else "?", applier.written))
    applier.cache.save()
    missing = sorted(set(os.path.normpath(r) for r in plan["expect"]) - received)
    if missing:
        raise IOError("the stream lacked %d files, e.g. %s" % (len(missing), missing[0]))
    applier.remove_old_files()
    applier.replace_dist_info()
    # Every file has landed: the journal (temp names to clear) has done its work, and goes even when
    # the record cannot be written, so the next run does not take a finished overlay for a cut one.
    with state_full_said(applier, "the overlay manifest", "every file is in %s, each whole; only the record "
                         "`fleetctl drift` reads (manifest, origins) is missing" % applier.prefix, applier.journal):
        manifest = write_manifest(plan, applier)
    os.unlink(applier.journal)
    return {"written": applier.written, "removed": applier.removed, "bytes_in": source.bytes_in,
            "seconds": round(time.time() - started, 3), "manifest": manifest}


def stream_main():
    fd = sys.stdin.fileno()
    header = b""
    while len(header) < 4:
        chunk = os.read(fd, 4 - len(header))
        if not chunk:
            raise EOFError("no plan received")
        header += chunk
    size = struct.unpack(">I", header)[0]
    body = b""
    while len(body) < size:
        chunk = os.read(fd, min(1 << 20, size - len(body)))
        if not chunk:
            raise EOFError("the plan was cut short")
        body += chunk
    plan = json.loads(body.decode("utf-8"))
    direct = None
    try:
        if plan.get("direct"):
            direct = DirectSource(plan["direct"])
            direct.start()
            read = direct.read
        else:
            def read(n):
                return os.read(fd, n)
        answer = {"ok": True, "result": apply(plan, read)}
    except DirectError as exc:
        answer = {"ok": False, "error": "DirectError: %s" % exc, "unreachable": str(exc)}
    except NotPermitted as exc:  # refused before any change: the line as it is
        answer = {"ok": False, "error": str(exc), "not_permitted": True}
    except Exception as exc:
        answer = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    finally:
        if direct is not None:
            direct.close()
    sys.stdout.write("\n%s\n%s\n%s\n" % (BEGIN, json.dumps(answer), END))
    sys.stdout.flush()


if __name__ == "__main__":
    stream_main()
