# fleetctl-include: model_host
# fleetctl-include: model_old_staging
# The files of one model revision on a host, for `fleetctl models sync`.
#
# Stdlib only, Python >= 3.8. Agent entry point main(params):
#   {"action": "manifest", "path": dir, "cache_dir"?}: the source's manifest (model_manifest's format):
#     the one kept in the folder when it still describes the files there by name and size, else built:
#     each file hashed, unless the host's verified-hash store (model_host.HashStore, in cache_dir)
#     holds its hash from a time its size, mtime, inode and ctime were those it has now.
#   {"action": "check", "dest": dir, "files": [[rel, size, sha256]], "manifest_name": name}:
#     whether dest holds exactly this model (its manifest names these files and each is at its size),
#     which files a sync must still send (those not yet landed and verified in the staging folder),
#     the bytes that needs, and the free bytes of dest's volume; "foreign" when dest exists and is
#     not this model (a sync never writes into a folder it did not make).
# Layout: files land in a staging folder beside dest (STAGING below), each written to a temporary
# name, hashed as it lands and renamed to its own name only when size and sha256 match; so a file
# at its own name in staging is verified. When every file is there the manifest is written last and
# the staging folder is renamed to dest in one step: a server never sees a partial model.
import fcntl
import json
import os
import shutil
import time

MARGIN = 16 << 20  # free space kept beyond the model's bytes (the manifest, metadata, a little air)


def staging_of(dest):
    parent, name = os.path.split(os.path.normpath(dest))
    if os.path.basename(parent) == "snapshots" and os.path.basename(os.path.dirname(parent)).startswith("models--"):
        # a HF cache snapshot: staged in the repo's .fleetctl/, not beside it in snapshots/, where the Hub's
        # own tools (`hf cache ls`, scan_cache_dir) would list the staging folder as a revision
        return os.path.join(os.path.dirname(parent), HF_MANIFEST_DIR, "partial", name)
    return os.path.join(parent, "." + name + ".fleetctl-partial")


def temp_dir_of(dest):
    return os.path.join(staging_of(dest), ".fleetctl-tmp")


def safe_rel(rel):
    """A manifest path must stay inside the model folder."""
    norm = os.path.normpath(rel)
    if os.path.isabs(norm) or norm == ".." or norm.startswith("../") or norm in (".", ""):
        raise ValueError("bad path in the manifest: %r" % rel)
    return norm


def source_manifest(path, cache_dir=None):
    """The folder's manifest: the kept one while every file it names is there at its size and no
    other file is (a cheap check; the full hash is `models verify --full`), else built now."""
    folder = os.path.normpath(path)
    if not os.path.isdir(folder):
        return {"error": "%s is not a folder" % folder}
    try:
        doc = load(manifest_path("folder", folder))
        if sorted(f["path"] for f in doc["files"]) == model_files(folder) and all(
                size_of(os.path.join(folder, f["path"])) == f["size"] for f in doc["files"]):
            return {"manifest": doc, "kept": True}
    except ValueError:
        pass
    if not cache_dir:
        return {"manifest": build_from_folder(folder), "kept": False}
    store = HashStore(cache_dir, os.path.realpath(folder))
    doc = build_from_folder(folder, hash_of=lambda path: stored_hash(store, path))
    store.save()
    return {"manifest": doc, "kept": False}


def stored_hash(store, path):
    """A file's sha256: the store's while the file is as it was when hashed, else hashed (and kept)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    known = store.known(real, st)
    return known[0] if known else store.hash(real, st)[0]


def size_of(path):
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def free_bytes(path):
    """Free bytes (for an unprivileged writer too) of the volume `path` is or would be on."""
    probe = os.path.normpath(path)
    while not os.path.exists(probe) and probe not in ("/", ""):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe or "/")
    return st.f_bavail * st.f_frsize


def manifest_files(dest, manifest_name):
    try:
        with open(os.path.join(dest, manifest_name), "r", encoding="utf-8") as handle:
            doc = json.load(handle)
    except (IOError, OSError, ValueError):
        return None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list):
        return None
    try:
        return sorted([f["path"], int(f["size"]), f["sha256"]] for f in files)
    except (KeyError, TypeError, ValueError):
        return None


def complete(dest, files, manifest_name):
    """dest holds this model: its manifest lists exactly these files and each is at its size."""
    if manifest_files(dest, manifest_name) != sorted([r, int(s), h] for r, s, h in files):
        return False
    return all(size_of(os.path.join(dest, safe_rel(rel))) == size for rel, size, _ in files)


def staged(dest, rel, size):
    """A file at its own name in staging was renamed there only after its hash matched."""
    return size_of(os.path.join(staging_of(dest), safe_rel(rel))) == size


# One sync of a path per host at a time: a lock file beside the staging folder, held by the sync's node
# (its pid and start time on this host, the controller's holder line, the sync's token), removed when
# it ends. A lock whose pid is no longer running (a killed sync) is stale and taken over; a live one
# refuses the second sync, naming its holder; a node of the same sync (the relay round) takes it over.
def lock_path(dest):
    return staging_of(dest) + ".lock"


def live_lock(dest):
    """The lock's document while the process holding it runs, else None (none, or stale)."""
    try:
        with open(lock_path(dest), "r", encoding="utf-8") as handle:
            doc = json.load(handle)
    except (IOError, OSError, ValueError):
        return None
    if type(doc) is not dict or not doc.get("pid"):
        return None
    start = pid_start(doc["pid"])
    return doc if start is not None and doc.get("pid_start") in (None, start) else None


def holder_line(doc):
    h = doc.get("holder") or {}
    when = time.strftime("%H:%M:%S UTC", time.gmtime(doc.get("since") or 0))
    return "being synced by %s@%s pid %s (%s) since %s; its node is pid %s on this host" % (
        h.get("user", "?"), h.get("controller", "?"), h.get("pid", "?"), h.get("command", "models sync"), when,
        doc.get("pid"))


def take_lock(dest, holder, stale=()):
    """None when this process now holds dest's sync lock, else the live holder's document."""
    path = lock_path(dest)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        os.makedirs(parent)
    body = json.dumps({"pid": os.getpid(), "pid_start": pid_start(os.getpid()), "holder": holder,
                       "since": time.time()})
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(body)
    guard = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)  # takers on this host one at a time: a stale lock is taken over once
        theirs = live_lock(dest)
        if theirs is not None and (theirs.get("holder") or {}).get("sync") not in [holder.get("sync"), *stale]:
            return theirs
        os.rename(tmp, path)  # none, stale, or an earlier node of this same sync: replaced whole
        return None
    finally:
        os.close(guard)
        if os.path.exists(tmp):
            os.unlink(tmp)


def release_lock(dest):
    try:
        with open(lock_path(dest), "r", encoding="utf-8") as handle:
            mine = json.load(handle).get("pid") == os.getpid()
    except (IOError, OSError, ValueError, AttributeError):
        return
    if mine:
        os.unlink(lock_path(dest))


def locked(dest, total, stale=()):
    """check's answer while another sync holds dest on this host. ``stale``: syncs whose controller
    is known dead (a SIGKILLed controller: its nodes may live on a moment), whose lock is taken over."""
    doc = live_lock(dest)
    if doc is None or doc.get("pid") == os.getpid() or (doc.get("holder") or {}).get("sync") in stale:
        return None
    return {"complete": False, "locked": holder_line(doc), "holder": doc, "total_bytes": total,
            "free": free_bytes(dest)}


def check_dest(params):
    dest, files, manifest_name = params["dest"], params["files"], params["manifest_name"]
    for rel, _, _ in files:
        safe_rel(rel)
    total = sum(size for _, size, _ in files)
    busy = locked(dest, total, params.get("stale_syncs") or ())
    if busy is not None:
        return busy
    if complete(dest, files, manifest_name):
        return {"complete": True, "need": [], "need_bytes": 0, "total_bytes": total, "free": free_bytes(dest)}
    if os.path.lexists(dest):
        return {"complete": False, "foreign": True, "total_bytes": total, "free": free_bytes(dest)}
    need = [i for i, (rel, size, _) in enumerate(files) if not staged(dest, rel, size)]
    need_bytes = sum(files[i][1] for i in need)
    return {"complete": False, "need": need, "need_bytes": need_bytes, "total_bytes": total,
            "free": free_bytes(dest), "room_needed": need_bytes + MARGIN}


def write_manifest(folder, manifest_name, text):
    path = os.path.join(folder, manifest_name)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(tmp, path)


def publish(dest, files, manifest_name, manifest_text):
    """Every file verified in staging: the manifest last, then staging becomes dest in one rename.
    True when dest now holds the model (made here or by a concurrent sync)."""
    if complete(dest, files, manifest_name):
        return True
    staging = staging_of(dest)
    if not all(staged(dest, rel, size) for rel, size, _ in files):
        return False
    write_manifest(staging, manifest_name, manifest_text)
    shutil.rmtree(temp_dir_of(dest), ignore_errors=True)  # a concurrent sync's half file: not published
    try:
        os.rename(staging, dest)
    except OSError:
        return complete(dest, files, manifest_name)
    fsync_dir(os.path.dirname(os.path.normpath(dest)))
    return True


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# A Hugging Face cache snapshot (plan "layout": "hf_cache"): dest is <cache>/models--ORG--NAME/snapshots/<rev>;
# the files sent are the revision's blobs (named by their etag: the rel of a file of the plan), landing in
# the same staging folder; "links" maps each snapshot path to its blob. Publishing moves the blobs into
# blobs/, writes the manifest in <repo>/.fleetctl/, then the snapshot folder of relative symlinks appears
# in one rename; refs/main is written only where the target has none (a branch is never moved).
def hf_dirs(dest):
    """(repo folder, blobs folder, revision) of a snapshot path."""
    snapshots, revision = os.path.split(os.path.normpath(dest))
    repo_dir = os.path.dirname(snapshots)
    return repo_dir, os.path.join(repo_dir, "blobs"), revision


def hf_source_manifest(cache, repo, revision):
    """The snapshot's manifest (the kept one while it still names the snapshot's files at their sizes,
    else built from the blob names) and each file's blob name."""
    snapshot = hf_snapshot(cache, repo, revision)
    if not os.path.isdir(snapshot):
        return {"error": "%s: no snapshot of revision %s in the cache" % (snapshot, revision)}
    try:
        doc = load(manifest_path("hf_cache", cache, repo, revision))
        if sorted(f["path"] for f in doc["files"]) != model_files(snapshot) or not all(
                size_of(os.path.join(snapshot, f["path"])) == f["size"] for f in doc["files"]):
            doc = build_from_hf_cache(cache, repo, revision)
    except ValueError:
        try:
            doc = build_from_hf_cache(cache, repo, revision)
        except ValueError as exc:
            return {"error": str(exc)}
    blobs = dict((f["path"], os.path.basename(os.path.realpath(os.path.join(snapshot, f["path"]))))
                 for f in doc["files"])
    return {"manifest": doc, "blobs": blobs}


def hf_linked(dest, rel, blob, size):
    """The snapshot entry is a symlink into blobs/ to ``blob``, which is there at ``size``."""
    path = os.path.join(dest, safe_rel(rel))
    _, blobs, _ = hf_dirs(dest)
    return (os.path.islink(path) and os.path.realpath(path) == os.path.join(os.path.realpath(blobs), blob)
            and size_of(path) == size)


def hf_check(params):
    dest, files, links = params["dest"], params["files"], params["links"]
    sizes = dict((blob, size) for blob, size, _ in files)
    _, blobs, _ = hf_dirs(dest)
    total = sum(sizes.values())
    busy = locked(dest, total, params.get("stale_syncs") or ())
    if busy is not None:
        return busy
    try:
        sweep_under_lock(dest, params)
    except (IOError, OSError):
        pass  # best effort: leftovers this user may not remove never fail the sync
    if os.path.lexists(dest):
        bad = [rel for rel, blob in links if not hf_linked(dest, rel, blob, sizes[blob])]
        if not bad:
            return {"complete": True, "need": [], "need_bytes": 0, "total_bytes": total, "free": free_bytes(dest)}
        return {"complete": False, "foreign": True, "total_bytes": total, "free": free_bytes(dest),
                "why": "%s exists but %s is not linked to its blob; remove the snapshot and re-run" % (dest, bad[0])}
    need = [i for i, (blob, size, _) in enumerate(files)
            if not staged(dest, blob, size) and size_of(os.path.join(blobs, safe_rel(blob))) != size]
    need_bytes = sum(files[i][1] for i in need)
    return {"complete": False, "need": need, "need_bytes": need_bytes, "total_bytes": total,
            "free": free_bytes(blobs), "room_needed": need_bytes + MARGIN}


def sweep_under_lock(dest, params):
    """What an older fleetctl's killed syncs left in this repo's snapshots/ (model_old_staging), removed
    while this host's sync lock of dest is ours (taken for it, or already held by this sync's node)."""
    repo_dir = hf_dirs(dest)[0]
    snapshots = os.path.join(repo_dir, "snapshots")
    if not os.path.isdir(snapshots) or not any(old_staging_of(name) for name in os.listdir(snapshots)):
        return []
    held = live_lock(dest)
    if held is not None and held.get("pid") == os.getpid():  # this sync's node, under its own lock
        return sweep_old_staging(repo_dir)[0]
    if take_lock(dest, params.get("holder") or {}, params.get("stale_syncs") or ()) is not None:
        return []  # another sync holds it now: its own check or node sweeps
    try:
        return sweep_old_staging(repo_dir)[0]
    finally:
        release_lock(dest)


def hf_publish(dest, files, links, manifest_text, landed=None):
    """Every blob staged or already in blobs/: blobs moved in, manifest, snapshot links, refs/main.
    ``landed(path, sha256)`` is told of each blob moved in (its hash proved as it landed in staging)."""
    if hf_check({"dest": dest, "files": files, "links": links}).get("complete"):
        return True
    repo_dir, blobs, revision = hf_dirs(dest)
    staging = staging_of(dest)
    for blob, size, _ in files:
        if not staged(dest, blob, size) and size_of(os.path.join(blobs, blob)) != size:
            return False
    if not os.path.isdir(blobs):
        os.makedirs(blobs)
    for blob, size, sha in files:
        if staged(dest, blob, size):
            os.rename(os.path.join(staging, blob), os.path.join(blobs, blob))
            if landed is not None:
                landed(os.path.join(blobs, blob), sha)
    tree = os.path.join(staging, ".fleetctl-snapshot")
    shutil.rmtree(tree, ignore_errors=True)
    for rel, blob in links:
        final = os.path.join(dest, safe_rel(rel))
        link = os.path.join(tree, safe_rel(rel))
        if not os.path.isdir(os.path.dirname(link)):
            os.makedirs(os.path.dirname(link))
        os.symlink(os.path.relpath(os.path.join(blobs, blob), os.path.dirname(final)), link)
    kept = os.path.join(repo_dir, HF_MANIFEST_DIR)  # manifest_path("hf_cache", ...), from the repo folder
    if not os.path.isdir(kept):
        os.makedirs(kept)
    write_manifest(kept, "%s.manifest.json" % revision, manifest_text)
    if not os.path.isdir(os.path.dirname(dest)):
        os.makedirs(os.path.dirname(dest))
    os.rename(tree, dest)
    ref = os.path.join(repo_dir, "refs", "main")
    if not os.path.exists(ref):
        if not os.path.isdir(os.path.dirname(ref)):
            os.makedirs(os.path.dirname(ref))
        with open(ref, "w") as handle:
            handle.write(revision)
    shutil.rmtree(staging, ignore_errors=True)
    fsync_dir(os.path.dirname(dest))
    return True


def main(params):
    action = (params or {}).get("action")
    if action == "manifest" and params.get("layout") == "hf_cache":
        return hf_source_manifest(params["cache"], params["repo"], params["revision"])
    if action == "manifest":
        return source_manifest(params["path"], params.get("cache_dir"))
    if action == "check" and params.get("layout") == "hf_cache":
        return hf_check(params)
    if action == "check":
        return check_dest(params)
    raise ValueError("unknown action %r" % action)
