"""Every distribution installed in one Python environment, and (optionally) whether its files
still match its RECORD. Run by that environment's own interpreter (the agent starts it as a
child), so the site-packages folders are the venv's.

Stdlib only, Python >= 3.8. One call answers everything drift needs from a host.

params:
  verify_files: bool       hash every RECORD file; list missing files and orphans
  cache_dir: str           where the hash cache lives (default /var/lib/fleetctl/cache)
  release_manifest: str    manifest.json of the release owning this venv (default: ../manifest.json)
  overlays_dir: str        where `fleetctl venv overlay` keeps its manifests (default /var/lib/fleetctl/overlays)
"""

import base64
import hashlib
import json
import os
import platform
import re
import sys
import sysconfig
import time

SKIP_DIRS = ("__pycache__",)
NORMALIZE = re.compile(r"[-_.]+")


def normalize(name):
    return NORMALIZE.sub("-", name).lower()


def main(params):
    params = params or {}
    dirs = site_dirs()
    dists = []
    for site in dirs:
        for entry in sorted(os.listdir(site)) if os.path.isdir(site) else []:
            if entry.endswith(".dist-info") and os.path.isdir(os.path.join(site, entry)):
                dists.append(read_dist(site, entry))
    answer = {
        "schema": 1,
        "python": sys.executable,
        "prefix": sys.prefix,
        "version": ".".join(str(n) for n in sys.version_info[:3]),
        "cache_tag": sys.implementation.cache_tag,
        "soabi": sysconfig.get_config_var("SOABI"),
        "platform": sysconfig.get_platform(),
        "markers": marker_environment(),
        "site_dirs": dirs,
        "dists": dists,
        "torch_cuda": torch_cuda(dists),
        "files": None,
    }
    mark_overlays(dists, params.get("overlays_dir") or "/var/lib/fleetctl/overlays")
    if params.get("verify_files"):
        answer["files"] = verify(dists, params)
    for dist in dists:
        dist.pop("_record", None)
    return answer


def mark_overlays(dists, overlays_dir):
    """Name the overlay a distribution came from (`overlay`: source host, venv, time), when this
    venv's origins index says so and the dist-info's RECORD is still the one the overlay wrote."""
    prefix = os.path.normpath(sys.prefix)
    name = "origins-%s.json" % hashlib.sha256(prefix.encode("utf-8")).hexdigest()[:16]
    text = read_text(os.path.join(overlays_dir, name))
    try:
        origins = (json.loads(text) if text else {}).get("dists") or {}
    except ValueError:
        return
    for dist in dists:
        origin = origins.get(dist["name"])
        if not origin or origin.get("dist_info") != dist["dist_info"]:
            continue
        record = os.path.join(dist["site"], dist["dist_info"], "RECORD")
        try:
            with open(record, "rb") as handle:
                same = hashlib.sha256(handle.read()).hexdigest() == origin.get("record_sha256")
        except (IOError, OSError):
            same = False
        if same:
            dist["overlay"] = {k: origin.get(k) for k in ("source_host", "source_venv", "time", "manifest")}


def site_dirs():
    paths = sysconfig.get_paths()
    found = []
    for key in ("purelib", "platlib"):
        path = os.path.realpath(paths[key])
        if path not in found:
            found.append(path)
    return found


def read_text(path):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def parse_metadata(text):
    """Name, Version and Requires-Dist from a METADATA file (RFC 822 headers, as pip reads them)."""
    from email.parser import HeaderParser

    msg = HeaderParser().parsestr(text or "")
    return msg.get("Name"), msg.get("Version"), [r.strip() for r in msg.get_all("Requires-Dist") or []]


def read_dist(site, entry):
    folder = os.path.join(site, entry)
    name, version, requires = parse_metadata(read_text(os.path.join(folder, "METADATA")))
    if name is None:  # a dist-info without METADATA: keep what its folder name says
        stem = entry[: -len(".dist-info")]
        name, _, version = stem.partition("-")
    record = read_record(site, folder)
    direct = read_text(os.path.join(folder, "direct_url.json"))
    installer = (read_text(os.path.join(folder, "INSTALLER")) or "").strip() or None
    return {
        "name": normalize(name),
        "display_name": name,
        "version": version,
        "dist_info": entry,
        "site": site,
        "installer": installer,
        "direct_url": describe_direct_url(direct),
        "requires": requires,
        "top_level": top_level(folder, record),
        "record_files": len(record),
        "_record": record,
    }


def describe_direct_url(text):
    """PEP 610: editable / vcs / local path / url, or None for an index install."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return {"kind": "invalid", "url": None}
    url = data.get("url")
    if data.get("dir_info", {}).get("editable"):
        return {"kind": "editable", "url": url}
    if "vcs_info" in data:
        vcs = data["vcs_info"]
        return {"kind": "vcs", "url": url, "vcs": vcs.get("vcs"), "commit": vcs.get("commit_id")}
    if "dir_info" in data:
        return {"kind": "local", "url": url}
    return {"kind": "url", "url": url}


def read_record(site, folder):
    """RECORD rows as (path relative to site, 'algo=digest' or '', size or None)."""
    import csv

    text = read_text(os.path.join(folder, "RECORD"))
    rows = []
    for row in csv.reader((text or "").splitlines()):
        if not row or not row[0]:
            continue
        path = row[0]
        digest = row[1] if len(row) > 1 else ""
        size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
        rows.append((path, digest, size))
    return rows


def top_level(folder, record):
    text = read_text(os.path.join(folder, "top_level.txt"))
    if text:
        return sorted(set(n.strip() for n in text.split() if n.strip()))
    names = set()
    for path, _digest, _size in record:
        first = path.split("/", 1)[0]
        if first.endswith((".dist-info", ".data")) or first in ("..", "") or first == "__pycache__":
            continue
        names.add(first[:-3] if first.endswith(".py") else first)
    return sorted(names)


def marker_environment():
    """PEP 508 marker variables of this interpreter (what packaging.markers.default_environment gives)."""
    impl = sys.implementation
    iver = "%d.%d.%d" % impl.version[:3]
    if impl.version.releaselevel != "final":
        iver += impl.version.releaselevel[0] + str(impl.version.serial)
    return {
        "implementation_name": impl.name,
        "implementation_version": iver,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def torch_cuda(dists):
    """torch's CUDA build from torch/version.py (dist metadata often lacks the +cuXYZ suffix)."""
    for dist in dists:
        if dist["name"] == "torch":
            text = read_text(os.path.join(dist["site"], "torch", "version.py")) or ""
            found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]*)['\"]", text, re.M)
            return found.group(1) if found else None
    return None


# --- file verification ----------------------------------------------------------------------

def file_digest(path, algo):
    h = hashlib.new(algo)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            h.update(chunk)
    return h


def b64(digest):
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class HashCache(object):
    """sha256 of files keyed by (path, size, mtime, inode): an unchanged file is hashed once."""

    def __init__(self, cache_dir, key):
        self.path = None
        self.entries = {}
        self.dirty = False
        self.hits = 0
        self.misses = 0
        if cache_dir:
            self.path = os.path.join(cache_dir, "hashes-%s.json" % hashlib.sha256(key.encode()).hexdigest()[:16])
            data = read_text(self.path)
            try:
                self.entries = json.loads(data) if data else {}
            except ValueError:
                self.entries = {}

    def sha256(self, path, st):
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        entry = self.entries.get(path)
        if entry and entry[:3] == stamp:
            self.hits += 1
            return entry[3]
        self.misses += 1
        value = b64(file_digest(path, "sha256").digest())
        self.entries[path] = stamp + [value]
        self.dirty = True
        return value

    def save(self):
        if not (self.path and self.dirty):
            return None
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = "%s.%d.tmp" % (self.path, os.getpid())
            with open(tmp, "w") as handle:
                json.dump(self.entries, handle)
            os.rename(tmp, self.path)  # atomic: a concurrent reader sees the old or the new cache
        except (IOError, OSError) as exc:
            return "hash cache not saved: %s" % exc
        return None


def matches(path, st, algo, expected, cache):
    if algo == "sha256":
        return cache.sha256(path, st) == expected
    return b64(file_digest(path, algo).digest()) == expected


def verify(dists, params):
    started = time.time()
    prefix = os.path.realpath(sys.prefix)
    cache = HashCache(params.get("cache_dir", "/var/lib/fleetctl/cache"), prefix)
    patched = release_hashes(params.get("release_manifest") or os.path.join(os.path.dirname(prefix),
                                                                             "manifest.json"))
    out = {"modified": [], "missing": [], "orphans": [], "patched": [], "foreign_shebangs": [],
           "checked": 0, "cache_hits": 0, "cache_misses": 0, "cache_error": None}
    owners = {}  # path -> dist-info folders whose RECORD lists it
    for dist in dists:
        verify_dist(dist, prefix, cache, patched, owners, out)
    out["orphans"] = find_orphans(dists, owners, shadowed_dist_infos(dists), prefix)
    added_by_release(out, patched, cache, prefix)
    out["cache_hits"], out["cache_misses"] = cache.hits, cache.misses
    out["cache_error"] = cache.save()
    out["seconds"] = round(time.time() - started, 3)  # the host's own time for the file check
    return out


def verify_dist(dist, prefix, cache, patched, owners, out):
    """One distribution's RECORD against the disk. The loop runs for every file of every package
    on every audit, so it stays lean: the cache answers unchanged files after one os.stat."""
    site, bindir, info, matched, checked = dist["site"], os.path.join(prefix, "bin") + "/", dist["dist_info"], 0, 0
    where = lambda path: {"dist": dist["name"], "path": under(path, prefix)}  # noqa: E731 - only for findings
    for rel, digest, _size in dist["_record"]:
        path = site + "/" + rel
        if "/." in path or "//" in path:  # only rows like ../../bin/x need the slow normalisation
            path = os.path.normpath(path)
        owners.setdefault(path, []).append(info)
        if path.endswith(".pyc") or "/__pycache__/" in path:
            continue
        try:
            st = os.stat(path)
        except OSError:
            out["missing"].append(where(path))
            continue
        script = path.startswith(bindir)
        if script:  # checked even when the hash matches: a copied RECORD vouches for a copied shebang
            outside = foreign_interpreter(path, prefix)
            if outside:
                out["foreign_shebangs"].append(dict(where(path), interpreter=outside))
        if not digest:
            continue  # RECORD itself and files pip records without a hash
        algo, _, expected = digest.partition("=")
        checked += 1
        if matches(path, st, algo, expected, cache) or (script and matches_modulo_shebang(path, algo, expected, prefix)):
            matched += 1
            continue
        found = where(path)
        release = patched.get(found["path"])
        if release and cache.sha256(path, st) == release["sha256"]:
            out["patched"].append(dict(found, release=release["release"], sha256=release["sha256"]))
            continue
        out["modified"].append(found)
    out["checked"] += checked
    dist["_matched"] = matched


def under(path, prefix):
    """``path`` relative to ``prefix`` (a plain slice when inside it: relpath is slow per file)."""
    if path.startswith(prefix + "/"):
        return path[len(prefix) + 1:]
    return os.path.relpath(path, prefix)


def foreign_interpreter(path, prefix):
    """The interpreter a script's shebang names when it lies outside this venv (a copied script)."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(4096)
    except (IOError, OSError):
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].strip().decode("utf-8", "replace").split()
    if not words or "python" not in os.path.basename(words[0]):
        return None
    interpreter = words[0]
    return None if interpreter.startswith(prefix + "/") or interpreter == "python" else interpreter


def matches_modulo_shebang(path, algo, expected, prefix):
    """A script pip wrote compares equal once its first line is put back to a form pip writes:
    the wheel's ``#!python``, or this venv's own interpreter (RECORD hashes the rewritten file)."""
    with open(path, "rb") as handle:
        data = handle.read()
    if not data.startswith(b"#!"):
        return False
    _first, sep, rest = data.partition(b"\n")
    short = "python%d.%d" % sys.version_info[:2]
    for line in ["python"] + [os.path.join(prefix, "bin", n) for n in ("python", "python3", short)] + [sys.executable]:
        if b64(hashlib.new(algo, b"#!" + line.encode() + sep + rest).digest()) == expected:
            return True
    return False


def shadowed_dist_infos(dists):
    """For a project with several dist-info folders, all but the one whose RECORD best matches the
    files on disk: their files are stale leftovers of a version copied over another."""
    by_name = {}
    for dist in dists:
        by_name.setdefault(dist["name"], []).append(dist)
    shadowed = set()
    for group in by_name.values():
        if len(group) > 1:
            ranked = sorted(group, key=lambda d: d.get("_matched", 0) / max(1, len(d["_record"])))
            shadowed.update(d["dist_info"] for d in ranked[:-1])
    return shadowed


def find_orphans(dists, owners, shadowed, prefix):
    """Files inside a distribution's top-level package folders that no live RECORD lists: owned by
    none, or only by a shadowed duplicate dist-info."""
    orphans = []
    seen = set()
    for dist in dists:
        for name in dist["top_level"]:
            folder = os.path.join(dist["site"], name)
            if folder in seen or not os.path.isdir(folder):
                continue
            seen.add(folder)
            for path in walk_files(folder):
                owned_by = owners.get(path, ())
                if path.endswith(".pyc") or any(o not in shadowed for o in owned_by):
                    continue
                item = {"dist": dist["name"], "path": under(path, prefix)}
                if owned_by:
                    item["left_by"] = owned_by[0]
                orphans.append(item)
    return orphans


def added_by_release(out, patched, cache, prefix):
    """Files a release added (in no RECORD) are 'patched by release X' when their hash is the one
    the release recorded, not orphans."""
    kept = []
    for item in out["orphans"]:
        release = patched.get(item["path"])
        path = os.path.join(prefix, item["path"])
        if release and cache.sha256(path, os.stat(path)) == release["sha256"]:
            out["patched"].append(dict(item, release=release["release"], sha256=release["sha256"], added=True))
        else:
            kept.append(item)
    out["orphans"] = kept


def walk_files(folder):
    """Every file under ``folder`` (sorted, __pycache__ skipped): scandir, cheaper than os.walk."""
    stack = [folder]
    while stack:
        with os.scandir(stack.pop()) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in reversed(entries):
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in SKIP_DIRS:
                    stack.append(entry.path)
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                yield entry.path


def release_hashes(manifest_path):
    """{path relative to the venv: {release, sha256}} for files a fleetctl release patched."""
    text = read_text(manifest_path) if manifest_path else None
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    release = data.get("release_id") or data.get("release") or "?"
    files = data.get("venv_files") or {}
    # The manifest holds hex sha256; RECORD and the cache use urlsafe base64 without padding.
    return {path: {"release": release, "sha256": b64(bytes.fromhex(sha))} for path, sha in files.items()}
