# fleetctl-include: writable
# Included by source.py (`# fleetctl-include: grep_cache`): what an earlier `probe grep` with the same
# terms learnt of each file (no term here; not text; these lines match), so that the next one reads
# no file that has not changed since.
# Stdlib only, Python >= 3.8; imports nothing a Python does not start with but marshal and zlib
# (both built in or already loaded by the agent).
#
# Why: a GPU host's page cache holds the model's weights, not the package's 2,600 source files,
# so a periodic audit's grep reads 38 MB back from disk every time, and it repeats the same terms.
# With this cache an unchanged tree is stat()ed, not read: sglang/srt's 2,597 files take ~15 ms
# instead of ~100 ms of CPU.
import marshal
import os
import sys
import time
import zlib

GREP_CACHE_SCHEMA = "fleetctl-grep/1"
NO_MATCH, MATCH, BINARY = 0, 1, 2  # a file's verdict: no term in it, some term in it, not text
# A file changed less than this before the search began is searched every time and never
# remembered: its ctime may not move again on a second write within the same clock tick (the
# "racy git" problem), so only files that have been still for a while are trusted by their stat.
SETTLE_NS = 2 * 10 ** 9
KEEP = 64  # grep caches kept per cache folder (one per searched folder and terms): the oldest go
ENTRY_LINES = 1000  # a matching file's entry is kept when it lists at most this many lines, else it is read again
ENTRY_KEYS = ("path", "counts", "lines", "hits", "context")


def valid_entry(entry, rel):
    """Whether a kept entry has the shape grep_file gives (a damaged or foreign one is read again)."""
    return (sorted(entry) == sorted(ENTRY_KEYS) and entry["path"] == rel and type(entry["hits"]) is list
            and type(entry["context"]) is list and type(entry["lines"]) is int and type(entry["counts"]) is dict)


def identity(st):
    """What a verdict is kept under: a file's (size, mtime_ns, inode, ctime_ns), the rule of
    drift's hash cache. A rewrite changes ctime, which no one can set back by hand."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


class GrepCache(object):
    """path (relative to the package's root folder) -> (identity, verdict, entry) of one search: one
    folder, one list of terms, one way of matching them, one number of context lines. entry: what
    grep_file answered for a matching file (None for the others), reused while the file is unchanged.

    The file: a crc32 line, then marshal (version 2) of {"schema", "key", "python", "files"}. It is
    written by this user's own searches only (0600 in a 0700 folder, replaced atomically); one not
    this user's, not private, damaged, of another search or written by another Python version is
    ignored whole. A verdict is used only while the file's identity is the one it was learnt under,
    and a file found to have changed is read and searched again."""

    def __init__(self, cache_dir, key):
        self.key = repr(key)
        self.entries = {}
        self.started_ns = time.time_ns()
        key_bytes = self.key.encode("utf-8", "surrogateescape")
        name = "grep-%08x%08x.marshal" % (zlib.crc32(key_bytes), zlib.adler32(key_bytes))
        self.path = os.path.join(cache_dir, name)
        self.ignored = self.load()  # why a cache file there was not used

    def load(self):
        data, distrust = read_private(self.path)
        if data is None:
            return distrust  # None: none yet (or unreadable: searched as if there were none)
        cut = data.find(b"\n")
        body = memoryview(data)[cut + 1:]
        if cut < 0 or data[:cut] != b"%08x" % zlib.crc32(body):
            return "damaged"
        try:
            doc = marshal.loads(body)
        except (EOFError, ValueError, TypeError):
            return "damaged"
        if (type(doc) is not dict or doc.get("schema") != GREP_CACHE_SCHEMA or doc.get("key") != self.key
                or doc.get("python") != sys.version or type(doc.get("files")) is not dict):
            return "not a grep cache of this search and python"
        self.entries = doc["files"]
        try:
            os.utime(self.path)  # last used: what KEEP's clean-up goes by
        except OSError:
            pass
        return None

    def look(self, path, rel):
        """(path's lstat or None, what is kept for ``rel`` while that stat shows the very file it
        was learnt from: NO_MATCH, BINARY, a matching file's entry, or None: read it)."""
        try:
            st = os.lstat(path)
        except OSError:
            return None, None
        kept = self.entries.get(rel)
        if type(kept) is not tuple or len(kept) != 3 or kept[0] != identity(st):
            return st, None
        if kept[1] == MATCH:
            return st, kept[2] if type(kept[2]) is dict and valid_entry(kept[2], rel) else None
        return st, kept[1] if kept[1] in (NO_MATCH, BINARY) else None

    def learn(self, learnt, rel, st, verdict, entry=None):
        """Put ``rel``'s verdict (and a matching file's entry, unless it lists over ENTRY_LINES lines)
        in ``learnt`` when it is news and the file has been still for SETTLE_NS."""
        if entry is not None:
            entry = dict(entry) if len(entry["hits"]) <= ENTRY_LINES else None  # trim_hits may change the answer's
        value = (identity(st), verdict, entry)
        if self.entries.get(rel) != value and max(st.st_ctime_ns, st.st_mtime_ns) < self.started_ns - SETTLE_NS:
            learnt[rel] = value

    def save(self, paths, learnt):
        """Keep what this search learnt (rel -> (identity, verdict, entry)) with what it reused, for the
        files it searched (``paths``, relative): a file gone drops out. Returns an error text."""
        entries = dict((rel, self.entries[rel]) for rel in paths if rel in self.entries)
        if not learnt and len(entries) == len(self.entries):
            return None  # the file on disk already says all this
        entries.update(learnt)
        body = marshal.dumps({"schema": GREP_CACHE_SCHEMA, "key": self.key, "python": sys.version,
                              "files": entries}, 2)
        error = write_private(self.path, b"%08x\n" % zlib.crc32(body) + body)
        if error is None:
            forget_oldest(os.path.dirname(self.path))
        return error


def forget_oldest(folder):
    """Remove the grep caches beyond the KEEP last used ones in ``folder``."""
    try:
        with os.scandir(folder) as it:
            found = [(e.stat(follow_symlinks=False).st_mtime_ns, e.path) for e in it
                     if e.name.startswith("grep-") and e.name.endswith(".marshal")]
    except OSError:
        return
    for _, path in sorted(found)[:-KEEP]:
        try:
            os.unlink(path)
        except OSError:
            pass


def reusable(entry, budget):
    """Whether a file's entry kept from an earlier search is the one grep_file would give now, with
    ``budget`` lines left to list: it lists all its lines, or at least as many as may be listed
    (trim_hits cuts it as grep_file would have)."""
    return len(entry["hits"]) == entry["lines"] or len(entry["hits"]) >= budget


def cache_note(cache, root, paths, parts):
    """Save what the search learnt; None when all went well (or no cache was asked for), else why
    the cache file was not used or not saved, in a few words."""
    if cache is None:
        return None
    learnt = {}
    for part in parts:
        learnt.update(part[4])
    cut = len(root.rstrip("/")) + 1
    error = cache.save([path[cut:] for path in paths], learnt)
    return error or (cache.ignored and "cache file ignored: %s" % cache.ignored)
