# Included by overlay_target.py (`# fleetctl-include: overlay_apply`): the applier of an overlay's stream on
# the target (decompress, hash as it reads, write each member beside its final path, then rename in the
# order apply() keeps safe), the in-flight journal, bytecode and empty-folder clean-up, the new RECORDs.
# Stdlib only, Python >= 3.8; uses relocate's and writable's helpers (included before it).

import contextlib
import errno
import hashlib
import io
import json
import os
import re
import shutil
import struct
import time
import zlib
from stat import S_ISREG

STATE_DIR = "/var/lib/fleetctl/overlays"
PYC_TAG = re.compile(r"^[a-z]+-\d+(\.opt-\d+)?\.pyc$")  # "cpython-311.pyc", "cpython-311.opt-1.pyc"


def journal_path(prefix, state_dir=None):
    key = hashlib.sha256(prefix.encode("utf-8")).hexdigest()[:16]
    return os.path.join(state_dir or STATE_DIR, "inflight-%s.json" % key)


class Decompressor(object):
    """A read-only file object over `read(n)` (stdin, or a direct source): what TarReader reads,
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
        # Uncompressed, the tar's own end-of-archive block is the end (TarReader has read it).
        return self.z is None or self.z.eof

    def read(self, size=-1):
        if self.z is None:  # as it came: what has arrived (TarReader asks again), never wait for more
            if not self.buf and size != 0:
                self.fill()
        else:
            while (size < 0 or len(self.buf) < size) and not self.z.eof:
                self.fill()
        size = len(self.buf) if size < 0 else min(size, len(self.buf))
        with memoryview(self.buf) as view:
            out = bytes(view[:size])  # one copy, not a bytearray slice and then bytes of it
        del self.buf[:size]  # deleting from the front of a bytearray is O(1) in CPython
        return out

    def finish(self):
        while not self.ended():
            self.fill()


WHOLE = 1 << 20  # a file up to this size is checked in memory before it is written


def urlsafe(h):
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode("ascii")


def hashed(chunks, h):
    for chunk in chunks:
        h.update(chunk)
        yield chunk


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
        self.fresh = {}  # folder -> made by this run (no bytecode in it to drop), looked at once
        self.umask = os.umask(0o022)
        os.umask(self.umask)

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

    def land(self, name, mode, mtime, size, reader):
        """One regular file of the stream (its bytes from `reader`): a dist-info file is read whole
        (it is written last), any other lands under its temporary name, checked against the hash
        the source listed, then renamed; a large one is copied in chunks (never held whole)."""
        rel = os.path.normpath(name)
        path = self.path(rel)
        if rel.split("/", 1)[0].endswith(".dist-info"):
            self.meta.append((rel, path, reader.content(size), mode, mtime))  # written last, see apply()
            return
        h, want = hashlib.sha256(), self.expected.get(rel)
        if size <= WHOLE:  # checked before anything is written: a changed file leaves nothing behind
            data = reader.content(size)
            h.update(data)
            self.check(rel, h, want)
            tmp, st = self.write_new(path, (data,), mode, mtime)
        else:
            tmp, st = self.write_new(path, hashed(reader.chunks(size), h), mode, mtime)
            try:
                self.check(rel, h, want)
            except ChangedAtSource:
                discard(tmp)
                raise
        try:
            os.replace(tmp, path)
        except BaseException:
            discard(tmp)
            raise
        self.cache.store(path, st, urlsafe(h), None)
        if self.fresh.get(path.rpartition("/")[0]) is not True:  # a folder made by this run holds no bytecode
            drop_bytecode(path)
        self.written += 1
        if self.plan.get("throttle_s"):
            time.sleep(float(self.plan["throttle_s"]))

    @staticmethod
    def check(rel, h, want):
        digest = urlsafe(h)
        if want is not None and digest != want:
            raise ChangedAtSource("%s arrived with sha256 %s, not the %s the source listed: it changed on the "
                                  "source during the transfer; run again" % (rel, digest, want))

    def write_new(self, path, chunks, mode, mtime):
        """`chunks` written under the temporary name of `path`, created with its mode (chmod only
        where the umask took bits away), its mtime set through the open file; (temp name, its
        stat). Its folder is made (or found) once per run. On any failure no temporary file is left."""
        folder, _, base = path.rpartition("/")
        if folder not in self.fresh:
            self.fresh[folder] = not os.path.isdir(folder)
            if self.fresh[folder]:
                os.makedirs(folder)
        tmp = folder + "/." + base + TEMP_SUFFIX
        flags, mode = os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode & 0o7777
        try:
            fd = os.open(tmp, flags, mode)
        except FileExistsError:  # a leftover of an interrupted write: never reuse its (maybe wider) mode
            os.unlink(tmp)
            fd = os.open(tmp, flags, mode)
        try:
            try:
                for chunk in chunks:
                    view, done = memoryview(chunk), 0
                    while done < len(view):
                        done += os.write(fd, view[done:])
                if mode & (self.umask | 0o7000):
                    os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))
                st = os.fstat(fd)
            finally:
                os.close(fd)
        except BaseException:
            discard(tmp)  # a full disk (or any failure) leaves no temporary file behind
            raise
        return tmp, st

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
