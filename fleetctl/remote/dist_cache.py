# fleetctl-include: hash_cache
# Included by distributions.py (`# fleetctl-include: dist_cache`): what an earlier run read from each
# dist-info folder (METADATA's name, version and Requires-Dist, RECORD's sha256 and row count, the
# top-level names, the paths to stat), so that a run where no METADATA, RECORD or top_level.txt
# changed parses none of them: 207 distributions of SGLang's closure list 76,242 files, and parsing
# their RECORDs and METADATA was a third of a warm `drift --verify-files` on the host.
# Stdlib only, Python >= 3.8.
import hashlib
import marshal
import os
import sys
from stat import S_ISREG

DIST_CACHE_SCHEMA = "fleetctl-drift-dists/1"
DIST_FILES = ("METADATA", "RECORD", "top_level.txt")  # what an entry's value is derived from


def file_identity(path):
    """(size, mtime_ns, inode, ctime_ns) of ``path``, None when it is not there: the hash cache's
    rule, so an entry is used only while every file it came from is the very file it read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def private_identity(path):
    """``path``'s identity, owner and mode when it is a regular file of this user's (not followed),
    else None: what the file ``read_private`` accepted must still be, for a memory of it to stand."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_dev, st.st_mode, st.st_uid)


class DistCache(object):
    """folder of a dist-info -> [identities of DIST_FILES, value], one private file per venv.

    The file: a sha256 line, then marshal (version 2) of {"schema", "key", "python", "entries"}.
    marshal, not JSON: loading 76,000 paths is a few ms. It is written by this user's own runs
    only (0600 in a 0700 folder, replaced atomically); one not this user's, not private, damaged,
    of another venv or written by another Python version is ignored whole, and an entry whose
    value is not of the expected shape is parsed again."""

    def __init__(self, cache_dir, key):
        self.key = key
        self.entries = {}
        self.used = set()
        self.changed = False
        self.shared = False  # ``entries`` is the kept agent's remembered dict: copied before a change
        self.path = None
        self.ignored = None
        if cache_dir:
            name = "dists-%s.marshal" % hashlib.sha256(key.encode()).hexdigest()[:16]
            self.path = os.path.join(cache_dir, name)
            self.ignored = self.load()

    def load(self):
        """Read the file; a kept agent (AGENT_MEMO) remembers what it read while the file is the very
        one (its identity, owner and mode): the next command's audit does not decode it again, which
        was most of a version-only audit's time on the host."""
        memo = globals().get("AGENT_MEMO")
        ident = private_identity(self.path) if memo is not None else None
        known = memo.get(("dist_cache", self.path)) if ident is not None else None
        if known is not None and known[0] == ident:
            self.entries, self.shared = known[1], True
            return None
        found = self.read_file()
        if found is None and ident is not None and private_identity(self.path) == ident:
            memo[("dist_cache", self.path)] = (ident, self.entries)  # one entry per venv: bounded
            self.shared = True
        return found

    def read_file(self):
        data, distrust = read_private(self.path)
        if data is None:
            return distrust  # None: none yet (or unreadable: parsed as if there were none)
        cut = data.find(b"\n")
        check, body = memoryview(data)[:max(cut, 0)], memoryview(data)[cut + 1:]  # no copy of the 5 MB body
        if cut < 0 or check != hashlib.sha256(body).hexdigest().encode():
            return "damaged"
        try:
            doc = marshal.loads(body)
        except (EOFError, ValueError, TypeError):
            return "damaged"
        if (type(doc) is not dict or doc.get("schema") != DIST_CACHE_SCHEMA or doc.get("key") != self.key
                or doc.get("python") != sys.version or type(doc.get("entries")) is not dict):
            return "not a dist cache of this venv and python"
        self.entries = doc["entries"]
        return None

    def get(self, folder, idents):
        """The value kept for ``folder`` while its files' identities are ``idents``, else None."""
        self.used.add(folder)
        entry = self.entries.get(folder)
        if type(entry) is tuple and len(entry) == 2 and entry[0] == idents:
            return entry[1]
        return None

    def keep(self, folder, idents, value):
        if self.shared:
            self.entries, self.shared = dict(self.entries), False
        self.used.add(folder)
        self.entries[folder] = (idents, value)
        self.changed = True

    def save(self):
        """Write when this run parsed something or a folder is gone. Returns an error text."""
        if not self.path or (not self.changed and set(self.entries) <= self.used):
            return None
        entries = dict((k, v) for k, v in self.entries.items() if k in self.used)
        body = marshal.dumps({"schema": DIST_CACHE_SCHEMA, "key": self.key, "python": sys.version,
                              "entries": entries}, 2)
        return write_private(self.path, hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


def read_dist_cached(site, entry, cache):
    """read_dist, answered from ``cache`` (a DistCache or None) while the folder's METADATA, RECORD
    and top_level.txt are the files it read."""
    folder = os.path.join(site, entry)
    if cache is None:
        return read_dist(site, entry)
    idents = tuple(file_identity(os.path.join(folder, name)) for name in DIST_FILES)
    known = cache.get(folder, idents)
    if valid_parsed(known):
        return dist_from_parsed(site, entry, folder, known)
    dist = read_dist(site, entry)
    targets, scripts = compact_targets(dist)
    dist["_targets"], dist["_scripts"] = targets, scripts
    cache.keep(folder, idents, (dist["display_name"], dist["version"], tuple(dist["requires"]),
                                dist["_record_sha256"], dist["record_files"], tuple(dist["top_level"]),
                                targets, scripts))
    return dist


def valid_parsed(value):
    if type(value) is not tuple or len(value) != 8:
        return False
    name, version, requires, sha, count, tops, targets, scripts = value
    return (type(name) is str and (version is None or type(version) is str) and type(requires) is tuple
            and type(sha) is str and type(count) is int and type(tops) is tuple and type(targets) is tuple
            and type(scripts) is tuple)


def dist_from_parsed(site, entry, folder, value):
    name, version, requires, sha, count, tops, targets, scripts = value
    direct = read_text(os.path.join(folder, "direct_url.json"))  # small, not cached: read as read_dist does
    installer = (read_text(os.path.join(folder, "INSTALLER")) or "").strip() or None
    return {
        "name": normalize(name), "display_name": name, "version": version, "dist_info": entry, "site": site,
        "installer": installer, "direct_url": describe_direct_url(direct), "requires": list(requires),
        "top_level": list(tops), "record_files": count,
        "_record": None,  # parsed from RECORD only when a check needs its rows (see record_rows)
        "_record_path": os.path.join(folder, "RECORD"), "_record_sha256": sha,
        "_targets": targets, "_scripts": scripts,
    }


def record_rows(dist):
    """The RECORD rows of ``dist``, parsed on first use when the dist came from the cache."""
    if dist["_record"] is None:
        dist["_record"] = read_record(dist["_record_path"])[0]
    return dist["_record"]


def compact_targets(dist):
    """(paths to stat, console scripts): each ``record_files`` row's path relative to the site
    folder where it lies inside it, else absolute (os.stat with dir_fd ignores dir_fd for an
    absolute path); the scripts are the absolute ones under the venv's bin/."""
    site = dist["site"]
    cut = len(site) + 1
    bindir = os.path.join(os.path.realpath(sys.prefix), "bin") + "/"
    targets, scripts = [], []
    for path, _digest in record_files(dist):
        if path.startswith(site) and path[cut - 1:cut] == "/":
            targets.append(path[cut:])
        else:
            targets.append(path)
            if path.startswith(bindir):
                scripts.append(path)
    return tuple(targets), tuple(scripts)
