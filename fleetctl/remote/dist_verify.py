"""File verification for ``distributions.py`` (drift --verify-files): every RECORD file against the
disk (hash, through the hash cache; missing; a foreign shebang), files a release patched or added,
files shared by two distributions, orphans. Included by distributions.py (``# fleetctl-include``),
whose helpers it uses with dist_cache's and parallel_stat's; stdlib only, Python >= 3.8."""

import hashlib
import json
import os
import sys
import time
from stat import S_ISDIR

DIST_OUTCOME = ("missing", "modified", "patched")


def verify(dists, params):
    started = time.time()
    prefix = os.path.realpath(sys.prefix)
    cache = HashCache(user_cache_dir(params.get("cache_dir") or "/var/lib/fleetctl/cache", "cache"), prefix)
    patched = release_hashes(params.get("release_manifest") or os.path.join(os.path.dirname(prefix),
                                                                             "manifest.json"))
    out = {"modified": [], "missing": [], "orphans": [], "patched": [], "foreign_shebangs": [], "shared": [],
           "checked": 0, "cache_hits": 0, "cache_misses": 0, "cache_error": None}
    # What a distribution's outcome depends on besides its RECORD and its files' stats: the
    # interpreter paths a console script's shebang may name, and the files a release patched.
    context = (prefix, sys.executable, tuple(sys.version_info[:2]), sorted(patched.items()))
    for dist, stamps in zip(dists, stamps_in_parallel(dists)):
        verify_dist(dist, prefix, cache, patched, context, out, stamps)
    shadowed = shadowed_dist_infos(dists)
    out["shared"] = shared_files(dists, shadowed, out, prefix, cache)
    out["orphans"] = find_orphans(dists, shadowed, prefix, cache)
    added_by_release(out, patched, cache, prefix)
    out["cache_hits"], out["cache_misses"] = cache.hits, cache.misses
    out["cache_error"] = cache.save(dists)
    out["cache_ignored"] = cache.ignored
    out["seconds"] = round(time.time() - started, 3)  # the host's own time for the file check
    return out


def verify_dist(dist, prefix, cache, patched, context, out, stamps):
    """One distribution's RECORD against the disk. ``stamps``: its files' stats (stat_dist's, from
    the parallel stat pass); when they pin the outcome of an earlier run (the snapshot), nothing
    else is read."""
    site, bindir = dist["site"], os.path.join(prefix, "bin") + "/"
    scripts = [path for path in stat_targets(dist)[1] if os.path.exists(path)]  # those the stat pass finds
    where = lambda path: {"dist": dist["name"], "path": under(path, prefix)}  # noqa: E731 - only for findings
    for path in scripts:  # checked even when the hash matches: a copied RECORD vouches for a copied shebang
        outside = foreign_interpreter(path, prefix)
        if outside:
            out["foreign_shebangs"].append(dict(where(path), interpreter=outside))
    name = "dist:%s/%s" % (cache.rel(site), dist["dist_info"])
    value = pin(stamps, context, site, dist["name"], dist["dist_info"], dist["_record_sha256"])
    known = cache.snapshot(name, value)
    if valid_outcome(known):
        for key in DIST_OUTCOME:
            out[key].extend(known[key])
        out["checked"] += known["checked"]
        cache.hits += known["lookups"]
        dist["_matched"] = known["matched"]
        return
    before = cache.hits + cache.misses
    sts = stat_dist(dist, True)[0]  # stat again: a file changed since is checked as it is now, and
    # the snapshot keeps the earlier stamps, so the next run checks it again
    found = {key: [] for key in DIST_OUTCOME}
    matched = checked = 0
    for (path, digest), st in zip(record_files(dist), sts):
        if st is None:
            found["missing"].append(where(path))
            continue
        if not digest:
            continue  # RECORD itself and files pip records without a hash
        algo, _, expected = digest.partition("=")
        checked += 1
        actual = cache.sha256(path, st) if algo == "sha256" else b64(file_digest(path, algo).digest())
        if actual == expected or (path.startswith(bindir) and matches_modulo_shebang(path, algo, expected, prefix)):
            matched += 1
            continue
        item = where(path)
        release = patched.get(item["path"])
        if release and cache.sha256(path, st) == release["sha256"]:
            found["patched"].append(dict(item, release=release["release"], sha256=release["sha256"]))
            continue
        found["modified"].append(item)
    for key in DIST_OUTCOME:
        out[key].extend(found[key])
    out["checked"] += checked
    dist["_matched"] = matched
    cache.keep_snapshot(name, value, dict(found, checked=checked, matched=matched,
                                          lookups=cache.hits + cache.misses - before))


def stat_targets(dist):
    """(paths to stat, console scripts) of ``record_files`` rows, in their order (compact_targets):
    from the dist cache when the dist came from it, else a kept agent (AGENT_MEMO) keeps them per
    distribution folder and RECORD content."""
    if dist.get("_targets") is not None:
        return dist["_targets"], dist["_scripts"]
    memo = globals().get("AGENT_MEMO")
    key = ("stat_targets", dist["site"], dist["dist_info"])
    if memo is not None:
        known = memo.get(key)
        if known is not None and known[0] == dist["_record_sha256"]:
            return known[1]
    found = compact_targets(dist)
    if memo is not None:
        memo[key] = (dist["_record_sha256"], found)  # one entry per distribution folder: bounded
    return found


def record_files(dist):
    """(path, 'algo=digest' or '') of each RECORD row of ``dist`` but compiled files."""
    site, normpath = dist["site"], os.path.normpath
    for rel, digest, _size in record_rows(dist):
        path = site + "/" + rel
        if "/." in path or "//" in path:  # only rows like ../../bin/x need the slow normalisation
            path = normpath(path)
        if not (path.endswith(".pyc") or "/__pycache__/" in path):
            yield path, digest


def valid_outcome(known):
    if type(known) is not dict:
        return False
    return (all(type(known.get(k)) is list and all(type(i) is dict for i in known[k]) for k in DIST_OUTCOME)
            and all(type(known.get(k)) is int for k in ("checked", "matched", "lookups")))


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
            ranked = sorted(group, key=lambda d: d.get("_matched", 0) / max(1, d["record_files"]))
            shadowed.update(d["dist_info"] for d in ranked[:-1])
    return shadowed


def shared_files(dists, shadowed, out, prefix, cache):
    """A file that several live distributions list in their RECORD (flashinfer-python and
    torch_c_dlpack_ext both install build_backend.py): the one installed last wins, and the file
    then differs from the others' RECORD. Where it matches one owner's hash exactly, it is not a
    modified file but a shared one: moved from ``modified`` to the answer, one item per path, the
    owners named and whose copy is installed. Only modified paths are looked up, so a venv with
    none costs nothing here. The answer of an earlier run is reused while the modified paths, their
    files' stats and every live RECORD are the same (its work reads every RECORD row and the
    per-file hash entries)."""
    if not out["modified"]:
        return []
    wanted = {}
    for item in out["modified"]:
        wanted.setdefault(os.path.normpath(os.path.join(prefix, item["path"])), []).append(item)
    stamps = []
    for path in sorted(wanted):
        try:
            st = os.stat(path)
            stamps.extend((st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
        except OSError:
            stamps.append(None)
    records = [(d["name"], d["site"], d["dist_info"], d["_record_sha256"]) for d in dists if d["dist_info"] not in shadowed]
    value = pin(stamps, prefix, sorted(wanted), records)
    known = cache.snapshot("shared", value)
    if (type(known) is dict and type(known.get("shared")) is list and type(known.get("moved")) is list
            and all(type(i) is dict for i in known["shared"]) and all(type(p) is str for p in known["moved"])):
        moved_paths = set(known["moved"])
        out["modified"] = [i for i in out["modified"]
                           if os.path.normpath(os.path.join(prefix, i["path"])) not in moved_paths]
        return known["shared"]
    owners = {}  # full path -> [(dist name, digest)] of every live RECORD listing it
    for dist in dists:
        if dist["dist_info"] in shadowed:
            continue
        site = dist["site"]
        for rel, digest, _size in record_rows(dist):
            path = os.path.normpath(site + "/" + rel)
            if path in wanted:
                owners.setdefault(path, []).append((dist["name"], digest))
    shared, moved = [], set()
    for path in sorted(wanted):
        listed = owners.get(path, [])
        if len(set(name for name, _ in listed)) < 2:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        actual = cache.sha256(path, st)
        winner = next((name for name, digest in listed if digest == "sha256=" + actual), None)
        if winner is None:
            continue  # matches no owner: a modified file after all
        shared.append({"dist": winner, "path": under(path, prefix),
                       "owners": sorted(set(name for name, _ in listed)), "installed": winner})
        moved.add(path)
    out["modified"] = [i for i in out["modified"] if os.path.normpath(os.path.join(prefix, i["path"])) not in moved]
    cache.keep_snapshot("shared", value, {"shared": shared, "moved": sorted(moved)})
    return shared


def record_owners(dists):
    """path -> dist-info folders whose RECORD lists it."""
    owners = {}
    for dist in dists:
        site, info = dist["site"], dist["dist_info"]
        for rel, _digest, _size in record_rows(dist):
            path = site + "/" + rel
            if "/." in path or "//" in path:
                path = os.path.normpath(path)
            owners.setdefault(path, []).append(info)
    return owners


def find_orphans(dists, shadowed, prefix, cache):
    """Files inside a distribution's top-level package folders that no live RECORD lists: owned by
    none, or only by a shadowed duplicate dist-info. The answer of an earlier walk is reused while
    the RECORDs and every folder's stat are the same (the folders are all there is to list)."""
    tops = []  # (folder, stat, dist), each folder once
    seen = set()
    for dist in dists:
        for name in dist["top_level"]:
            folder = os.path.join(dist["site"], name)
            if folder in seen:
                continue
            try:
                st = os.stat(folder)
            except OSError:
                continue
            if S_ISDIR(st.st_mode):
                seen.add(folder)
                tops.append((folder, st, dist))
    owners_pin = [(d["name"], d["site"], d["dist_info"], d["top_level"], d["_record_sha256"]) for d in dists]
    known = cache.stored("orphans")
    if (type(known) is dict and type(known.get("folders")) is list and type(known.get("orphans")) is list
            and all(type(i) is dict and type(i.get("path")) is str for i in known["orphans"])):
        stamps = []
        for st in folder_stats(tops, known["folders"], cache):
            stamps.extend((st.st_ino, st.st_mtime_ns, st.st_ctime_ns) if st else (None,))
        value = pin(stamps, prefix, owners_pin, sorted(shadowed), known["folders"])
        if cache.snapshot("orphans", value) is not None:
            return known["orphans"]
    owners = record_owners(dists)
    orphans, below = [], []  # below: (path, stat) of the folders under the top ones, as walked
    for folder, st, dist in tops:
        visited = []
        for path in walk_files(folder, st, cache, visited):
            owned_by = owners.get(path)
            if owned_by is not None and (not shadowed or any(o not in shadowed for o in owned_by)):
                continue
            item = {"dist": dist["name"], "path": under(path, prefix)}
            if owned_by:
                item["left_by"] = owned_by[0]
            orphans.append(item)
        below.extend(visited[1:])
    folders = [cache.rel(path) for path, _st in below]
    stamps = []
    for st in [st for _folder, st, _dist in tops] + [st for _path, st in below]:
        stamps.extend((st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
    cache.keep_snapshot("orphans", pin(stamps, prefix, owners_pin, sorted(shadowed), folders),
                        {"folders": folders, "orphans": orphans})
    return orphans


def folder_stats(tops, folders, cache):
    """The stat (None when gone) of each top folder, then of each of ``folders`` (the folders below
    them an earlier walk listed, relative to the venv), in the order walk_files visits them."""
    for _folder, st, _dist in tops:
        yield st
    for rel in folders:
        try:
            yield os.lstat(rel if rel.startswith("/") else cache.root + rel)
        except (OSError, TypeError, ValueError, AttributeError):
            yield None


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


def walk_files(folder, st, cache, visited):
    """Every file under ``folder`` but *.pyc (sorted, depth first, __pycache__ skipped). ``st``:
    the folder's stat. Listings come from the cache while a folder's stat says it is unchanged.
    ``visited`` gets (path, stat) of each folder listed."""
    stack = [(folder, st)]
    while stack:
        here, here_st = stack.pop()
        visited.append((here, here_st))
        names, subdirs = cache.listing(here, here_st)
        for name in reversed(subdirs):
            path = here + "/" + name
            try:
                sub_st = os.lstat(path)
            except OSError:
                continue
            if S_ISDIR(sub_st.st_mode):
                stack.append((path, sub_st))
        for name in names:
            yield here + "/" + name


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
