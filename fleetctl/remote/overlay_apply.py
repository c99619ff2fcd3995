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
import tarfile
import time
import zlib
from stat import S_ISREG

STATE_DIR = "/var/lib/fleetctl/overlays"
PYC_TAG = re.compile(r"^[a-z]+-\d+(\.opt-\d+)?\.pyc$")  # "cpython-311.pyc", "cpython-311.opt-1.pyc"


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
