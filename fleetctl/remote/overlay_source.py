# fleetctl-include: relocate
# fleetctl-include: venvinfo
# fleetctl-include: writable
# fleetctl-include: overlay_tar
# fleetctl-include: overlay_calls
# fleetctl-include: overlay_read
# The source side of `fleetctl venv overlay`, run by the source venv's own python.
#
# Stdlib only, Python >= 3.8. Two entry points:
#   main({"action": "list", "packages": [glob], "target_prefix": str, "files_for": [name]|None})
#     (an agent call): the selected distributions with a tree hash over every RECORD file's
#     sha256 as it would land on the target (text files naming this venv's prefix are relocated
#     to target_prefix first), the WHEEL tags and compiled-extension tags for the ABI check, and
#     for the distributions in files_for (all when None) the per-file list, zlib+base64 packed.
#   stream_main() (`python -c`, over its own exec channel): answers listing calls first (overlay_calls:
#     the same main(), its descriptions kept for the next call), then reads one length-prefixed JSON
#     {"send": [[dist_info, rel]], "target_prefix": str, "level": int} from stdin and writes MAGIC,
#     then a tar of exactly those files, as they must land, to stdout, in frames (see Framer);
#     zlib-compressed at `level` when it is above 0 (off by default: tar's own bytes, as ssh | tar).
#     A large binary file (never relocated) is sent from the file in chunks, not read whole.
# Paths are RECORD paths: relative to site-packages ("pkg/mod.py", "../../../bin/tool").
# .pyc files are never listed or sent: they embed the source path, and the target recompiles.
import email.parser
import io
import json
import os
import re
import struct
import sys
import sysconfig
import zlib
from stat import S_ISLNK

STREAM_MAGIC = b"\x00FLEETCTL-OVERLAY-1\n"
EXT_TAG = re.compile(r"\.((?:cpython|pypy)[-\w]*|abi3)\.(?:so|pyd)$")


def dist_infos(site):
    out = []
    for entry in sorted(os.listdir(site)) if os.path.isdir(site) else []:
        folder = os.path.join(site, entry)
        if entry.endswith(".dist-info") and os.path.isdir(folder):
            name, version = dist_name(folder, entry)
            out.append((normalize(name), version, entry))
    return out


def wheel_tags(folder):
    try:
        with open(os.path.join(folder, "WHEEL"), "r", encoding="utf-8", errors="replace") as handle:
            return [line.split(":", 1)[1].strip() for line in handle if line.lower().startswith("tag:")]
    except (IOError, OSError):
        return []


class Dist(object):
    """One installed distribution, its files as they would land at `target_prefix`."""

    def __init__(self, site, entry, prefix, target_prefix, cache=None):
        self.site, self.entry, self.prefix, self.target = site, entry, prefix, target_prefix
        self.folder = os.path.join(site, entry)
        self.rows = read_record(self.folder)
        self.regex = prefix_regex(prefix)
        self.cache = cache
        self.moved = {}  # rel -> (digest, size) of relocated files, so RECORD needs no second read
        self.ahead = {}  # rel -> digest()'s answer, hashed ahead on a thread (hash_ahead)
        self.found = None  # places(): each file's lookup, shared by hash_ahead and describe
        self.real_prefix, self.real_dirs = None, {}

    def skip(self, rel):
        return is_bytecode(rel) or rel == self.entry + "/RECORD"

    def path(self, rel):
        """The file a RECORD path names, None when it leaves the venv: by its name (``..``, absolute)
        or through a symlink (whose target is never read and sent)."""
        return self.located(rel)[0]

    def located(self, rel):
        """(path, its os.stat or None when absent) of a RECORD path; (None, None) when it leaves the
        venv. One lstat per file: the listing's loop runs for every file of every distribution."""
        path = os.path.normpath(os.path.join(self.site, rel))
        if not path.startswith(self.prefix + "/"):
            return None, None
        if self.real_prefix is None:
            self.real_prefix = os.path.realpath(self.prefix)
        folder, _, base = path.rpartition("/")
        real_dir = self.real_dirs.get(folder)
        if real_dir is None:  # resolved once per folder, not per file
            real_dir = self.real_dirs[folder] = os.path.realpath(folder)
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        real = real_dir + "/" + base
        if st is not None and S_ISLNK(st.st_mode):
            real = os.path.realpath(path)
            try:
                st = os.stat(path)
            except OSError:
                st = None
        if (real + "/").startswith(self.real_prefix + "/") and real != self.real_prefix:
            return path, st
        return None, None

    def places(self):
        """(rel, located(rel)) of each file the listing describes, in RECORD order: looked up once,
        for hash_ahead and describe both (one lstat per file, not two)."""
        if self.found is None:
            rels = (os.path.normpath(rel) for rel, _digest, _size in self.rows)
            self.found = [(rel, self.located(rel)) for rel in rels if not self.skip(rel)]
        return self.found

    def content(self, rel, path=None):
        """The bytes `rel` must have on the target, and whether they were relocated; None if absent."""
        if rel == self.entry + "/RECORD":
            return self.record(), False
        path = self.path(rel) if path is None else path
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except (IOError, OSError, TypeError):
            return None, False
        moved = relocate_bytes(data, self.prefix, self.target, self.regex)
        if moved is None:
            self.moved[rel] = None
            return data, False
        self.moved[rel] = (record_hash(moved), str(len(moved)))
        return moved, True

    def digest(self, rel, where=None):
        """(urlsafe sha256, size, relocated) of what `rel` becomes on the target; None if absent.
        An unchanged file that names no prefix is answered from the cache without reading it.
        ``where``: ``located(rel)`` when the caller has it already."""
        path, st = where or self.located(rel)
        if st is None:
            return None
        hit = self.cache.lookup(path, st) if self.cache else None
        if hit and hit[1] is False:  # None: hashed as a target, never checked for the prefix
            self.moved[rel] = None
            return hit[0], st.st_size, False
        binary = binary_digest(path, st.st_size)  # a large binary: hashed from the file, never held whole
        if binary is not None:
            self.moved[rel] = None
            if self.cache and not hit:
                self.cache.store(path, st, binary[0], False)
            return binary[0], binary[1], False
        data, moved = self.content(rel, path)
        if data is None:
            return None
        digest = record_hash(data)[7:]
        if self.cache and not moved and not hit:
            names = is_text(data) and bool(self.regex.search(data))  # kept whatever the target path
            self.cache.store(path, st, digest, names)
        return digest, len(data), moved

    def needs_reading(self, where):
        """Whether describing this file reads it (the cache cannot answer for it)."""
        path, st = where
        if st is None:
            return False
        hit = self.cache.lookup(path, st) if self.cache else None
        return not (hit and hit[1] is False)

    def record(self):
        """RECORD as the target gets it: no .pyc rows, relocated files rehashed, "\\n" line ends
        (the target compares its own RECORD the same way: comparable_record_hash)."""
        rows = []
        for rel, digest, size in self.rows:
            if is_bytecode(rel):
                continue
            key = os.path.normpath(rel)
            if digest and not self.skip(key):
                if key not in self.moved:
                    self.digest(key)
                digest, size = self.moved.get(key) or (digest, size)
            rows.append([rel, digest, size])
        return format_record(rows)

    def mode(self, rel):
        if rel == self.entry + "/RECORD":
            return 0o644, None
        st = os.stat(self.path(rel))
        return st.st_mode & 0o7777, st.st_mtime


def describe(dist, name, version):
    files, missing, outside, extensions = [], [], [], {}
    for rel, where in dist.places():
        if where[0] is None:
            outside.append(rel)
            continue
        found = dist.ahead.pop(rel) if rel in dist.ahead else dist.digest(rel, where)
        if found is None:
            missing.append(rel)
            continue
        files.append([rel, found[0], found[1], found[2]])
        tag = EXT_TAG.search(rel)
        if tag or rel.endswith((".so", ".pyd")) and "/" in rel:
            extensions.setdefault(tag.group(1) if tag else "", rel)
    record = dist.record()
    files.append([dist.entry + "/RECORD", record_hash(record)[7:], len(record), False])
    return {"name": name, "version": version, "dist_info": dist.entry, "tags": wheel_tags(dist.folder),
            "extensions": sorted([tag, rel] for tag, rel in extensions.items()), "files": files,
            "missing": missing, "outside": outside, "tree": tree_hash((f[0], f[1]) for f in files),
            "count": len(files), "bytes": sum(f[2] for f in files)}


DESCRIBED = None  # a stream process's descriptions, for its next call (the file lists after the listing)


def described(info, entry, target, cache, name, version, dist=None):
    """describe() of one distribution (``dist``: its Dist, when made already); in a stream process,
    once for all its calls (it lives for one overlay: what it listed first is what it sends)."""
    key = (entry, target)
    if DESCRIBED is not None and key in DESCRIBED:
        return DESCRIBED[key]
    found = describe(dist or Dist(info["site"], entry, info["prefix"], target, cache), name, version)
    if DESCRIBED is not None:
        DESCRIBED[key] = found
    return found


def main(params):
    params = params or {}
    if params.get("action", "list") != "list":
        raise ValueError("unknown action %r" % params.get("action"))
    info = interpreter()
    target = (params.get("target_prefix") or info["prefix"]).rstrip("/")
    patterns = params.get("packages") or []
    cache = HashCache(user_cache_dir(params.get("cache_dir") or "/var/lib/fleetctl/cache", "cache"), info["prefix"])
    chosen = [(name, version, entry) for name, version, entry in dist_infos(info["site"]) if wanted(name, patterns)]
    made = {entry: Dist(info["site"], entry, info["prefix"], target, cache) for _n, _v, entry in chosen
            if DESCRIBED is None or (entry, target) not in DESCRIBED}
    hash_ahead(list(made.values()))
    dists = [dict(described(info, entry, target, cache, name, version, made.get(entry)))
             for name, version, entry in chosen]
    cache.save()
    detail = params.get("files_for")  # names whose file lists the controller needs; None: all
    for dist in dists:
        files = dist.pop("files")
        if detail is None or dist["name"] in detail:
            dist["files_z"] = pack_json({"files": files, "missing": dist["missing"]})
        dist.pop("missing")
    return {"schema": 1, "interpreter": info, "dists": dists}


class Framer(object):
    """A write-only file object: sends the tar's bytes written to it on `out` in frames (4-byte length +
    bytes), zlib-compressed first when `level` > 0; a zero-length frame closes a stream that ended
    well, so the controller can tell a finished source from one that died."""

    FRAME = 1 << 18

    def __init__(self, out, level):
        self.out, self.z, self.raw, self.pending = out, zlib.compressobj(level) if level > 0 else None, 0, []
        self.size = 0

    def write(self, data):
        self.raw += len(data)
        packed = self.z.compress(data) if self.z is not None else bytes(data)
        if packed:
            self.pending.append(packed)
            self.size += len(packed)
            if self.size >= self.FRAME:
                self.emit()
        return len(data)

    def emit(self):
        data = self.pending[0] if len(self.pending) == 1 else b"".join(self.pending)
        self.pending, self.size = [], 0
        if data:
            self.out.write(struct.pack(">I", len(data)))
            self.out.write(data)

    def close(self):
        if self.z is not None:
            self.pending.append(self.z.flush())
        self.emit()
        self.out.write(struct.pack(">I", 0))
        self.out.flush()


def stream_main():
    global DESCRIBED
    DESCRIBED = {}
    params = serve_calls(sys.stdin.fileno(), main)
    if params is None:
        return  # listed only (a dry run, nothing to send): nothing asked, nothing sent
    out = sys.stdout.buffer
    info = interpreter()
    dists = {}
    out.write(STREAM_MAGIC)
    sink = Framer(out, int(params.get("level", 0)))
    for entry, rel in params["send"]:
        if entry not in dists:
            dists[entry] = Dist(info["site"], entry, info["prefix"], params["target_prefix"].rstrip("/"))
        dist = dists[entry]
        path, st = dist.located(rel) if rel != entry + "/RECORD" else (None, None)
        handle = binary_file(path, st.st_size) if st is not None else None
        try:
            if handle is not None:
                size, data = os.fstat(handle.fileno()).st_size, None
                dist.moved[rel] = None  # binary, never relocated: RECORD keeps its row, no second read
            else:
                data, _moved = dist.content(rel, path)
                if data is None:
                    raise IOError("%s vanished from the source while sending" % rel)
                size = len(data)
            mode, mtime = (st.st_mode & 0o7777, st.st_mtime) if st is not None else dist.mode(rel)
            mtime = int(mtime) if mtime is not None else int(os.path.getmtime(dist.folder))
            sink.write(tar_header(rel, size, mode, mtime))
            if data is None:
                send_file(sink, rel, handle, size)
            else:
                sink.write(data)
            sink.write(tar_padding(size))
        finally:
            if handle is not None:
                handle.close()
    sink.write(END_OF_ARCHIVE)
    sink.close()


if __name__ == "__main__":
    try:
        stream_main()
    except BaseException as exc:  # the controller reads the reason from stderr
        sys.stderr.write("overlay_source: %s: %s\n" % (type(exc).__name__, exc))
        sys.exit(1)
