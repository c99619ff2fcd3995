# fleetctl-include: writable
# Included by distributions.py (`# fleetctl-include: hash_cache`): the per-venv hash cache that lets
# `drift --verify-files` on an unchanged venv only stat its files. Stdlib only, Python >= 3.8.
import base64
import errno
import hashlib
import json
import marshal
import os
from stat import S_ISREG

CACHE_SCHEMA = "fleetctl-drift-hashes/2"


def file_digest(path, algo):
    h = hashlib.new(algo)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            h.update(chunk)
    return h


def b64(digest):
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def pin(stamps, *parts):
    """One sha256 over a list of stat numbers (None for a missing file) and ``parts``: equal pins
    mean equal stamps and parts. marshal writes the long list fast (version 2: no back-references,
    which depend on reference counts); another Python may write it otherwise, which only makes a
    pin not hold once."""
    return hashlib.sha256(marshal.dumps(stamps, 2) + repr(parts).encode("utf-8")).hexdigest()  # 2: no refs


class HashCache(object):
    """What earlier runs learnt about this venv's files, so that a run where nothing changed only
    stats them: no file is read, no folder listed.

    files: path -> [size, mtime_ns, inode, ctime_ns, sha256 as RECORD writes it]
    dirs:  folder -> [inode, mtime_ns, ctime_ns, file names but *.pyc, sub-folders but __pycache__]
    (paths relative to the venv). A file's hash is reused only while its size, mtime_ns, inode and
    ctime_ns are all those it had when hashed: ctime catches a rewrite that put the old mtime back,
    and no one can set it by hand. A folder's listing is reused only while its inode, mtime_ns and
    ctime_ns are unchanged: adding, removing or renaming an entry updates them.

    snapshots: the outcome of checking one distribution (or of the orphan walk), under a pin: a
    sha256 over everything the outcome depends on, the (size, mtime_ns, inode, ctime_ns) of every
    file (folder) included. A run whose pin is the same reuses the outcome: the per-file rule,
    applied to all files at once, without loading the per-file entries at all.

    One file per venv, three lines: the sha256 of the second; JSON of the snapshots and the sha256 of
    the third; JSON of files and dirs, parsed only when some snapshot does not hold. Private to this
    user (0600 in a 0700 folder), replaced atomically and only when this run learnt something;
    entries of files no RECORD lists any more are dropped. A file that is not this user's, not
    private, damaged (either checksum), not valid, or made for another venv is ignored whole."""

    def __init__(self, cache_dir, key):
        self.key = key
        self.root = key.rstrip("/") + "/"
        self.cut = len(self.root)
        self.path = None
        self.snapshots = {}  # name -> {"pin": str, "out": ...}; what the file held, then what this run found
        self.used_snapshots = set()
        self.files, self.dirs = {}, {}  # what the file held, plus what this run learnt
        self.body = None  # the file's entries (third line) until they are needed
        self.used_files, self.used_dirs = {}, {}
        self.walked = False  # the orphan walk ran: the folders it did not list are gone
        self.changed = False
        self.hits = 0
        self.misses = 0
        self.ignored = None  # why a cache file there was not used
        if cache_dir:
            self.path = os.path.join(cache_dir, "hashes-%s.json" % hashlib.sha256(key.encode()).hexdigest()[:16])
            self.ignored = self.load()

    def rel(self, path):
        return path[self.cut:] if path.startswith(self.root) else path

    def load(self):
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            return None if exc.errno == errno.ENOENT else "unreadable: %s" % exc
        with os.fdopen(fd, "rb") as handle:
            st = os.fstat(handle.fileno())
            if not S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                return "not a private file of this user"
            data = handle.read()
        # Slices of one memoryview: the entries are most of the file (18 MB for SGLang's closure),
        # and bytes.partition would copy them twice on every run.
        view = memoryview(data)
        first = data.find(b"\n")
        second = data.find(b"\n", first + 1) if first >= 0 else -1
        if second < 0:
            second = len(data)
        check, head, body = view[:max(first, 0)], view[first + 1:second], view[second + 1:]
        if check != hashlib.sha256(head).hexdigest().encode():
            return "damaged (its first line is not the checksum of its second)"
        try:
            doc = json.loads(str(head, "utf-8"))
        except ValueError:
            return "not valid JSON"
        if (type(doc) is not dict or doc.get("schema") != CACHE_SCHEMA or doc.get("key") != self.key
                or type(doc.get("snapshots")) is not dict or type(doc.get("body_sha256")) is not str):
            return "not a hash cache of this venv"
        if hashlib.sha256(body).hexdigest() != doc["body_sha256"]:  # any damage: none of the file is used
            return "damaged (its entries are not those its checksum names)"
        self.snapshots, self.body = doc["snapshots"], body
        return None

    def entries(self):
        """Check and parse the per-file and per-folder entries, once, when a snapshot did not hold."""
        if self.body is None:
            return
        body, self.body = self.body, None
        try:
            found = valid_entries(json.loads(str(body, "utf-8")))  # body: a memoryview of the file
        except ValueError:
            found = None
        if found is None:  # not what HashCache writes: none of its entries is used, the next save mends it
            self.ignored = "entries not valid"
            self.changed = True
            return
        self.files, self.dirs = found

    def stored(self, name):
        """The outcome stored under ``name``, whatever its pin (to learn what to pin)."""
        entry = self.snapshots.get(name)
        return entry.get("out") if type(entry) is dict else None

    def snapshot(self, name, value):
        """The outcome stored under ``name`` when its pin is ``value``, else None."""
        self.used_snapshots.add(name)
        entry = self.snapshots.get(name)
        if type(entry) is dict and entry.get("pin") == value:
            return entry.get("out")
        return None

    def keep_snapshot(self, name, value, out):
        self.used_snapshots.add(name)
        self.snapshots[name] = {"pin": value, "out": out}
        self.changed = True

    def sha256(self, path, st):
        self.entries()
        key = path[self.cut:] if path.startswith(self.root) else path
        entry = self.files.get(key)
        if (entry is not None and entry[0] == st.st_size and entry[1] == st.st_mtime_ns and entry[2] == st.st_ino
                and entry[3] == st.st_ctime_ns):
            self.hits += 1
            self.used_files[key] = entry
            return entry[4]
        self.misses += 1
        value = b64(file_digest(path, "sha256").digest())
        self.files[key] = self.used_files[key] = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, value]
        self.changed = True
        return value

    def listing(self, folder, st):
        """(file names, sub-folder names) in ``folder``, sorted; .pyc files and __pycache__ left out.
        ``st``: the folder's stat."""
        self.entries()
        self.walked = True
        key = folder[self.cut:] if folder.startswith(self.root) else folder
        entry = self.dirs.get(key)
        if entry is not None and entry[0] == st.st_ino and entry[1] == st.st_mtime_ns and entry[2] == st.st_ctime_ns:
            self.used_dirs[key] = entry
            return entry[3], entry[4]
        names, subdirs = [], []
        try:
            with os.scandir(folder) as it:
                for item in it:
                    if item.is_dir(follow_symlinks=False):
                        if item.name not in SKIP_DIRS:
                            subdirs.append(item.name)
                    elif not item.name.endswith(".pyc"):
                        names.append(item.name)
        except OSError:
            return [], []
        names.sort()
        subdirs.sort()
        self.dirs[key] = self.used_dirs[key] = [st.st_ino, st.st_mtime_ns, st.st_ctime_ns, names, subdirs]
        self.changed = True
        return names, subdirs

    def save(self, dists):
        """Write what this run learnt, when it learnt something or dropped a snapshot. Returns an
        error text."""
        if not self.path:
            return None
        if not self.changed and set(self.snapshots) == self.used_snapshots:
            return None  # the file on disk already says all this
        self.entries()
        listed = set(self.used_files)
        listed.update(self.rel(path) for path in record_owners(dists))  # a file keeps its entry while a RECORD lists it
        files = {k: v for k, v in self.files.items() if k in listed}
        dirs = self.used_dirs if self.walked else self.dirs
        snapshots = {k: v for k, v in self.snapshots.items() if k in self.used_snapshots}
        body = json.dumps({"files": files, "dirs": dirs}, separators=(",", ":")).encode("utf-8")
        head = json.dumps({"schema": CACHE_SCHEMA, "key": self.key, "body_sha256": hashlib.sha256(body).hexdigest(),
                           "snapshots": snapshots}, separators=(",", ":")).encode("utf-8")
        return write_private(self.path, hashlib.sha256(head).hexdigest().encode() + b"\n" + head + b"\n" + body)


def valid_entries(doc):
    """(files, dirs) of a cache file's second line, or None when it is not what HashCache writes."""
    if type(doc) is not dict:
        return None
    files, dirs = doc.get("files"), doc.get("dirs")
    if type(files) is not dict or type(dirs) is not dict:
        return None
    for entry in files.values():
        if type(entry) is not list or len(entry) != 5 or type(entry[4]) is not str:
            return None
    for entry in dirs.values():
        if type(entry) is not list or len(entry) != 5 or type(entry[3]) is not list or type(entry[4]) is not list:
            return None
        try:
            "".join(entry[3]) + "".join(entry[4])  # names are strings
        except TypeError:
            return None
    return files, dirs
