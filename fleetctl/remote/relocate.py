# Host-side helpers to make a venv's files work at another path. Included by other remote
# modules with `# fleetctl-include: relocate` (overlay_source, overlay_target, the release work).
#
# Stdlib only, Python >= 3.8. Paths are absolute host paths unless a name says otherwise.
#   relocate_bytes(data, old, new)      -> new bytes, or None when nothing (or a binary) changed
#   relocate_file(path, old, new)       -> True when the file was rewritten (temp name + rename)
#   relocate_venv(venv, old, new)       -> rewritten paths: scripts, activate*, pyvenv.cfg, text
#                                          files under site-packages; RECORD rows updated
#   rewrite_record(dist_info, changed)  -> RECORD rows of `changed` files rehashed from disk
#   atomic_write(path, data, mode, mtime), temp_name(path), record_hash(data), read_record(...)
#   comparable_record_hash(dist_info)  -> a RECORD's digest as overlay compares it (no .pyc rows, LF)
#   HashCache(cache_dir, key)           -> file hashes kept across runs by (size, mtime, inode)
#   tree_hash(pairs), pack_json(doc)    -> one digest for a whole distribution; compact answers
import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import zlib

TEMP_SUFFIX = ".fleetctl-tmp"
# A prefix ends where a path-name character cannot follow it: /root/env matches in
# "/root/env/bin/python" and "'/root/env'", never in "/root/env2".
_AFTER_PREFIX = br"(?![A-Za-z0-9_.+\-])"


def prefix_regex(old_prefix):
    old = old_prefix.rstrip("/").encode("utf-8")
    return re.compile(re.escape(old) + _AFTER_PREFIX)


def is_text(data):
    """Binary files (extensions, .pyc, images) hold NUL bytes; a length-changing edit would break them."""
    return b"\0" not in data


def relocate_bytes(data, old_prefix, new_prefix, regex=None):
    """`data` with every `old_prefix` path replaced by `new_prefix`; None for a binary or no match."""
    if old_prefix.rstrip("/") == new_prefix.rstrip("/") or not is_text(data):
        return None
    regex = regex or prefix_regex(old_prefix)
    if not regex.search(data):
        return None
    new = new_prefix.rstrip("/").encode("utf-8")
    return regex.sub(lambda _m: new, data)


def temp_name(path):
    """The temporary name a file is written under, in its own folder (so the rename is atomic)."""
    folder, base = os.path.split(path)
    return os.path.join(folder, "." + base + TEMP_SUFFIX)


def atomic_write(path, data, mode=None, mtime=None):
    """Write `data` to a temporary name beside `path`, then rename: readers see old or new, never half."""
    tmp = write_temp(path, data, mode, mtime)
    try:
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise


def write_temp(path, data, mode=None, mtime=None):
    """`data` (bytes, or a file object to copy from) written whole under the temporary name of `path` (returned); renaming it over `path`
    is then the commit. On any failure (a full disk) no temporary file is left."""
    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        os.makedirs(folder)
    tmp = temp_name(path)
    # Created with its final mode (umask applies when none is given, as open() does): a 0600 file
    # such as service.env is never readable by others, even briefly.
    if os.path.lexists(tmp):
        os.unlink(tmp)  # a leftover of an interrupted write: never reuse its (maybe wider) mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode & 0o7777)
    try:
        with os.fdopen(fd, "wb") as handle:
            if hasattr(data, "read"):  # a file object: copied in chunks
                shutil.copyfileobj(data, handle, 1 << 20)
            else:
                handle.write(data)
        if mode is not None:
            os.chmod(tmp, mode & 0o7777)
        if mtime is not None:
            os.utime(tmp, (mtime, mtime))
    except BaseException:
        discard(tmp)  # a full disk (or any failure) leaves no temporary file behind
        raise
    return tmp


def discard(path):
    if os.path.lexists(path):
        os.unlink(path)


def relocate_file(path, old_prefix, new_prefix):
    """Rewrite one file in place (temp + rename, mode and mtime kept); True when it changed."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        st = os.stat(path)
    except (IOError, OSError):
        return False
    new = relocate_bytes(data, old_prefix, new_prefix)
    if new is None:
        return False
    atomic_write(path, new, st.st_mode, st.st_mtime)
    return True


def record_hash(data):
    """A RECORD digest: 'sha256=' + urlsafe base64 without padding (PEP 376 / 627)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return "sha256=" + digest


def _file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            h.update(chunk)
    return h


def file_hash(path):
    """The file's RECORD digest ('sha256=' + urlsafe base64)."""
    return "sha256=" + base64.urlsafe_b64encode(_file_digest(path).digest()).rstrip(b"=").decode("ascii")


def file_sha256(path):
    """The file's sha256 as hex."""
    return _file_digest(path).hexdigest()


def read_record(dist_info_dir):
    """RECORD rows as lists [path relative to site-packages, digest, size]."""
    try:
        with open(os.path.join(dist_info_dir, "RECORD"), "r", encoding="utf-8", newline="") as handle:
            text = handle.read()
    except (IOError, OSError):
        return []
    return [(row + ["", ""])[:3] for row in csv.reader(io.StringIO(text)) if row and row[0]]


def format_record(rows):
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        writer.writerow(row)
    return out.getvalue().encode("utf-8")


def is_bytecode(rel):
    return rel.endswith(".pyc") or "__pycache__/" in rel


def comparable_record_hash(dist_info_dir):
    """The digest a RECORD is compared by (urlsafe, no 'sha256='), None when there is none: its
    rows as overlay_source sends them, bytecode rows left out, "\\n" line ends. pip writes
    "\\r\\n" and lists the .pyc files it compiled, so two installs of one wheel are rarely
    byte-equal RECORDs, though they list the same files with the same hashes."""
    if not os.path.isfile(os.path.join(dist_info_dir, "RECORD")):
        return None
    rows = [row for row in read_record(dist_info_dir) if not is_bytecode(row[0])]
    return record_hash(format_record(rows))[7:]


def rewrite_record(dist_info_dir, changed_paths):
    """Rehash the RECORD rows of files in `changed_paths` (absolute) from what is on disk now.
    Returns how many rows changed; RECORD is rewritten atomically, only when one did."""
    site = os.path.dirname(os.path.abspath(dist_info_dir))
    changed = set(os.path.normpath(p) for p in changed_paths)
    rows = read_record(dist_info_dir)
    updated = 0
    for row in rows:
        path = os.path.normpath(os.path.join(site, row[0]))
        if path in changed and row[1] and os.path.isfile(path):
            digest, size = file_hash(path), str(os.path.getsize(path))
            if [digest, size] != row[1:3]:
                row[1], row[2] = digest, size
                updated += 1
    if updated:
        atomic_write(os.path.join(dist_info_dir, "RECORD"), format_record(rows))
    return updated


def site_packages_of(venv):
    lib = os.path.join(venv, "lib")
    found = []
    for name in sorted(os.listdir(lib)) if os.path.isdir(lib) else []:
        site = os.path.join(lib, name, "site-packages")
        if name.startswith("python") and os.path.isdir(site):
            found.append(site)
    return found


def relocate_venv(venv, old_prefix, new_prefix):
    """Make a venv copied from `old_prefix` work at `venv` (== `new_prefix`): every text file in
    bin/ (console scripts, activate*), pyvenv.cfg and the text files under site-packages naming
    the old prefix are rewritten, then the RECORD rows of those files. Returns the changed paths."""
    changed = []
    candidates = [os.path.join(venv, "pyvenv.cfg")]
    bindir = os.path.join(venv, "bin")
    for name in sorted(os.listdir(bindir)) if os.path.isdir(bindir) else []:
        candidates.append(os.path.join(bindir, name))
    sites = site_packages_of(venv)
    for site in sites:
        for root, dirs, files in os.walk(site):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            candidates.extend(os.path.join(root, f) for f in files)
    for path in candidates:
        if os.path.isfile(path) and not os.path.islink(path) and relocate_file(path, old_prefix, new_prefix):
            changed.append(path)
    for site in sites:
        for entry in sorted(os.listdir(site)):
            if entry.endswith(".dist-info"):
                rewrite_record(os.path.join(site, entry), changed)
    return changed


class HashCache(object):
    """RECORD-style sha256 of files (and whether their text names a prefix), kept across runs by
    (size, mtime_ns, inode): an unchanged file is read once. Files land by rename, so a rewritten
    file always has a new inode. One JSON file per cache key, replaced atomically; best effort."""

    def __init__(self, cache_dir, key):
        name = "overlay-%s.json" % hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
        self.path = os.path.join(cache_dir, name) if cache_dir else None
        self.entries, self.dirty = {}, False
        try:
            with open(self.path, "r") as handle:
                self.entries = json.load(handle)
        except (IOError, OSError, ValueError, TypeError):
            self.entries = {}

    def lookup(self, path, st):
        """(digest, names_prefix) when `path` is unchanged since it was hashed, else None."""
        entry = self.entries.get(path)
        if entry and entry[:3] == [st.st_size, st.st_mtime_ns, st.st_ino]:
            return entry[3], entry[4]
        return None

    def store(self, path, st, digest, names_prefix):
        self.entries[path] = [st.st_size, st.st_mtime_ns, st.st_ino, digest, names_prefix]
        self.dirty = True

    def save(self):
        if not (self.path and self.dirty):
            return
        try:
            atomic_write(self.path, json.dumps(self.entries).encode("utf-8"))
        except (IOError, OSError):
            pass  # a cache that cannot be written only costs time next run


def tree_hash(entries):
    """One sha256 over (RECORD path, file digest) pairs: two sides agree on a whole distribution
    by exchanging this instead of a hash per file."""
    h = hashlib.sha256()
    for rel, digest in sorted(entries):
        h.update(("%s\0%s\n" % (rel, digest)).encode("utf-8"))
    return h.hexdigest()


def pack_json(doc):
    """A large JSON answer as zlib + base64 text (paths compress ~5x): fewer bytes on the wire."""
    return base64.b64encode(zlib.compress(json.dumps(doc).encode("utf-8"), 6)).decode("ascii")


def unpack_json(text):
    return json.loads(zlib.decompress(base64.b64decode(text)).decode("utf-8")) if text else None
