# fleetctl-include: writable
# fleetctl-include: model_manifest
# fleetctl-include: model_check
# fleetctl-include: model_old_staging
# Models on one host: status, verification in tiers, removal. Stdlib only, Python >= 3.8.
#
# params: {"op": "verify" | "remove", "models": [{"key", "layout": "folder"|"hf_cache", "path"? (folder),
#          "cache"?, "repo"?, "revision"?, "expect_revision"?}], "tier": "quick"|"deploy"|"full",
#          "cache_dir": where the verified-hash store lives, "root": fleetctl_root (remove: kept releases)}
# Tiers: quick = every file present at its manifest size, HF symlinks resolve inside the repo's blobs/,
# every safetensors header parses and covers its file, the index's weight_map complete (no file read
# whole); deploy = quick, and every file whose (size, mtime_ns, inode, ctime_ns) is not the one it had
# when last hashed is hashed again (a same-size bit flip changes mtime and ctime); full = every byte.
# The verified-hash store: <cache_dir>/models/verified-<sha256(base)[:16]>.json, private to this user,
# {"schema", "base", "files": {real path: [size, mtime_ns, ino, ctime_ns, sha256, unix time hashed]}}.
# Progress: asked for (the agent's AGENT_PROGRESS), the bytes hashed so far and the bytes the tier will
# hash on this host, {"bytes", "total"}, go to the controller at the start, every PROGRESS_S, and at the end.
import glob
import hashlib
import json
import os
import shutil
import time

STORE_SCHEMA = "fleetctl-model-hashes/1"
SEVERITY = {"missing": 4, "corrupt": 3, "incomplete": 2, "revision": 2, "unverified": 1}
PROGRESS_S = 0.25  # the controller redraws at most four times a second


def model_base(m):
    if m["layout"] == "folder":
        return m["path"]
    return hf_snapshot(m["cache"], m["repo"], m["revision"])


def model_manifest_path(m):
    if m["layout"] == "folder":
        return manifest_path("folder", m["path"])
    return manifest_path("hf_cache", m["cache"], m["repo"], m["revision"])


class HashStore(object):
    """What this host learnt hashing a model's files: a hash is reused only while the file's size,
    mtime_ns, inode and ctime_ns are those it had when hashed (ctime: no one can set it back)."""

    def __init__(self, cache_dir, base):
        self.base = base
        self.path = os.path.join(user_cache_dir(cache_dir, "models"), "models",
                                 "verified-%s.json" % hashlib.sha256(base.encode()).hexdigest()[:16])
        self.files, self.changed = {}, False
        data, _ = read_private(self.path)
        try:
            doc = json.loads(data.decode("utf-8")) if data else None
        except ValueError:
            doc = None
        if type(doc) is dict and doc.get("schema") == STORE_SCHEMA and doc.get("base") == base:
            self.files = doc.get("files") or {}

    def known(self, real, st):
        """(sha256, when) hashed while the file was as it is now, else None."""
        entry = self.files.get(real)
        if (type(entry) is list and len(entry) == 6 and entry[0] == st.st_size and entry[1] == st.st_mtime_ns
                and entry[2] == st.st_ino and entry[3] == st.st_ctime_ns):
            return entry[4], entry[5]
        return None

    def hash(self, real, st, progress=None):
        value, when = sha256_file(real, progress), time.time()
        after = os.stat(real)  # changed while read: the hash proves nothing about the file as it is
        if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            self.files[real] = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, value, when]
            self.changed = True
        return value, when

    def save(self):
        if not self.changed:
            return None
        body = json.dumps({"schema": STORE_SCHEMA, "base": self.base, "files": self.files}, sort_keys=True)
        return write_private(self.path, body.encode("utf-8"))


def manifest_of(m, base, problems):
    """The model's manifest: the one kept beside it; for a HF snapshot without one, derived from its blob
    names (cheap: only the small git blobs are hashed). None for a folder without one."""
    where = model_manifest_path(m)
    if os.path.exists(where):
        try:
            return load(where)
        except ManifestError as exc:
            problems.append((os.path.basename(where), "corrupt", str(exc)))
            return None
    if m["layout"] == "hf_cache":
        try:
            return build_from_hf_cache(m["cache"], m["repo"], m["revision"])
        except BlobMismatch as exc:
            problems.append((exc.rel, "corrupt", str(exc)))
            return None
        except (ManifestError, OSError):
            return None  # a dangling link: the listing below names it
    problems.append((FOLDER_MANIFEST, "unverified", "no manifest beside the model (written by `models sync`)"))
    return None


def present_files(m, base, manifest, problems):
    """rel -> (real path, stat) of the files found at their manifest size; problems for the rest."""
    found = {}
    blobs = os.path.realpath(os.path.join(m.get("cache") or "", hf_repo_folder(m.get("repo") or ""), "blobs"))
    entries = manifest["files"] if manifest else [{"path": rel, "size": None} for rel in model_files(base)]
    for entry in entries:
        rel = entry["path"]
        path = os.path.join(base, rel)
        real = os.path.realpath(path)
        if m["layout"] == "hf_cache" and os.path.islink(path) and not real.startswith(blobs + os.sep):
            problems.append((rel, "incomplete", "symlink resolves outside the cache's blobs/ (%s)" % os.readlink(path)))
            continue
        try:
            st = os.stat(real)
        except OSError:
            what = "dangling symlink to %s" % os.readlink(path) if os.path.islink(path) else "missing"
            problems.append((rel, "incomplete", what))
            continue
        if entry["size"] is not None and st.st_size != entry["size"]:
            problems.append((rel, "incomplete", "size %d, manifest says %d (%s)" % (
                st.st_size, entry["size"], "truncated" if st.st_size < entry["size"] else "grown")))
            continue
        found[rel] = (real, st)
    return found


class Hashing(object):
    """The bytes hashed so far on this host, told to the controller while it asked (AGENT_PROGRESS)."""

    def __init__(self, total):
        self.tell = globals().get("AGENT_PROGRESS") if total else None
        self.total, self.done, self.last = total, 0, 0.0
        self.report(force=True)

    def add(self, n):
        self.done += n
        self.report()

    def report(self, force=False):
        now = time.monotonic()
        if self.tell is not None and (force or now - self.last >= PROGRESS_S):
            self.last = now
            self.tell({"bytes": self.done, "total": self.total})


def must_hash(tier, known):
    return tier == "full" or (tier == "deploy" and known is None)


def bytes_to_hash(job, tier):
    """What hash_files will read of this model at ``tier``."""
    if job is None:
        return 0
    manifest, found, store = job
    return sum(found[e["path"]][1].st_size for e in manifest["files"] if e["path"] in found
               and must_hash(tier, store.known(*found[e["path"]])))


def hash_files(manifest, found, store, tier, problems, hashing=None):
    """Compare sha256 with the manifest as ``tier`` asks. Returns (bytes hashed now, the time since which
    every file is known to match, or None when some file is not)."""
    hashed, times, unproven = 0, [], False
    for entry in manifest["files"]:
        rel = entry["path"]
        if rel not in found:
            unproven = True
            continue
        real, st = found[rel]
        known = store.known(real, st)
        if must_hash(tier, known):
            value, when = store.hash(real, st, hashing.add if hashing else None)
            hashed += st.st_size
        elif known is not None:
            value, when = known
        else:  # never hashed as it is now
            unproven = True
            continue
        if value != entry["sha256"]:
            problems.append((rel, "corrupt", "sha256 %s..., manifest says %s..." % (value[:12], entry["sha256"][:12])))
            unproven = True
        times.append(when)
    return hashed, (None if unproven or not times else min(times))


def free_bytes(path):
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except OSError:
        return None


def verify_models(models, tier, cache_dir):
    """Every model checked first, then hashed, so the progress frames know the host's total."""
    checked = [inspect_model(m, cache_dir) for m in models]
    hashing = Hashing(sum(bytes_to_hash(job, tier) for _, _, job in checked))
    answers = [finish_model(out, problems, job, tier, hashing) for out, problems, job in checked]
    hashing.report(force=True)
    return answers


def inspect_model(m, cache_dir):
    """(answer so far, problems, what is left to hash: (manifest, found, store) or None)."""
    base = model_base(m)
    out = {"key": m.get("key"), "layout": m["layout"], "path": base, "present": os.path.isdir(base),
           "manifest": False, "name": None, "revision": m.get("revision"), "bytes": None, "files": 0,
           "verified_at": None, "hashed_bytes": 0, "problems": [], "state": "ok"}
    out["free_bytes"] = free_bytes(base if out["present"] else os.path.dirname(base.rstrip("/")) or "/")
    problems, job = [], None
    if not out["present"]:
        problems.append(("", "missing", "not on this host (%s)" % base))
    else:
        manifest = manifest_of(m, base, problems)
        if manifest is not None:
            out.update(manifest=True, name=manifest["name"], revision=manifest["revision"],
                       bytes=manifest["total_bytes"], files=len(manifest["files"]))
            if m.get("expect_revision") and manifest["revision"] != m["expect_revision"]:
                problems.append(("", "revision", "holds revision %s, the spec wants %s" % (
                    manifest["revision"], m["expect_revision"])))
        found = present_files(m, base, manifest, problems)
        sizes = dict((rel, st.st_size) for rel, (real, st) in found.items())
        flawed = set(p[0] for p in problems)
        for rel, what in structure_problems(base, sorted(found), sizes):
            if rel not in flawed:
                problems.append((rel, "corrupt" if manifest is not None else "incomplete", what))
        if manifest is None:
            out["bytes"], out["files"] = sum(sizes.values()), len(sizes)
        else:
            job = (manifest, found, HashStore(cache_dir, os.path.realpath(base)))
    return out, problems, job


def finish_model(out, problems, job, tier, hashing):
    if job is not None:
        manifest, found, store = job
        out["hashed_bytes"], out["verified_at"] = hash_files(manifest, found, store, tier, problems, hashing)
        store.save()
    out["problems"] = [{"file": f, "kind": k, "what": w} for f, k, w in problems]
    if problems:
        out["state"] = max((p[1] for p in problems), key=lambda k: SEVERITY[k])
    return out


def kept_model_paths(root):
    """Every model path a kept release's service*.json names (its launch command and its models)."""
    used = {}
    for params_file in glob.glob(os.path.join(root, "releases", "*", "service*.json")):
        release = os.path.basename(os.path.dirname(params_file))
        try:
            with open(params_file, "r", encoding="utf-8") as handle:
                doc = json.load(handle)
        except (IOError, OSError, ValueError):
            continue
        words = [w for w in doc.get("command") or [] if isinstance(w, str)]
        words += [v.get("path") for v in (doc.get("models") or {}).values() if type(v) is dict]
        for word in words:
            if word:
                used.setdefault(os.path.normpath(word), release)
    return used


def remove_model(m, root):
    base = os.path.normpath(model_base(m))
    used = kept_model_paths(root)
    for path, release in sorted(used.items()):
        if path == base or path.startswith(base + os.sep):
            raise ValueError("%s is used by kept release %s: not removed" % (path, release))
    if m["layout"] == "hf_cache":  # with the snapshot, what an older fleetctl's killed sync left beside it
        swept, swept_bytes = sweep_old_staging(os.path.join(m["cache"], hf_repo_folder(m["repo"])))
        out = remove_snapshot(m, base) if os.path.isdir(base) else {
            "key": m.get("key"), "path": base, "removed": False, "freed_bytes": 0}
        out.update(swept=swept, freed_bytes=out["freed_bytes"] + swept_bytes)
        return out
    if not os.path.isdir(base):
        return {"key": m.get("key"), "path": base, "removed": False, "freed_bytes": 0}
    if not (os.path.exists(model_manifest_path(m)) or os.path.exists(os.path.join(base, "config.json"))):
        raise ValueError("%s holds no model (no manifest, no config.json): not removed" % base)
    freed = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(base) for f in fs
                if not os.path.islink(os.path.join(d, f)))
    shutil.rmtree(base)
    return {"key": m.get("key"), "path": base, "removed": True, "freed_bytes": freed}


def remove_snapshot(m, base):
    """One snapshot, its manifest, and the blobs no other snapshot of the repo links to."""
    repo_dir = os.path.join(m["cache"], hf_repo_folder(m["repo"]))
    mine = set(os.path.realpath(os.path.join(base, rel)) for rel in model_files(base))
    shutil.rmtree(base)
    others = set()
    for snap in glob.glob(os.path.join(repo_dir, "snapshots", "*")):
        others.update(os.path.realpath(os.path.join(snap, rel)) for rel in model_files(snap))
    freed = 0
    for blob in sorted(mine - others):
        if os.path.dirname(blob) == os.path.realpath(os.path.join(repo_dir, "blobs")) and os.path.isfile(blob):
            freed += os.path.getsize(blob)
            os.unlink(blob)
    try:
        os.unlink(model_manifest_path(m))
    except OSError:
        pass
    drop_refs_to(repo_dir, m["revision"])
    return {"key": m.get("key"), "path": base, "removed": True, "freed_bytes": freed}


def drop_refs_to(repo_dir, revision):
    """Refs (refs/main, ...) naming the removed revision go with it, as the Hub's own `hf cache rm` does:
    a ref to a missing commit is a corrupted cache to huggingface_hub's scan."""
    for folder, _, names in os.walk(os.path.join(repo_dir, "refs")):
        for name in names:
            path = os.path.join(folder, name)
            try:
                with open(path, "r", encoding="utf-8") as handle:
                    if handle.read().strip() == revision:
                        os.unlink(path)
            except (IOError, OSError, ValueError):
                continue


def current_models(root):
    """The models the current release names (its service.json ``models``), as verify takes them."""
    try:
        with open(os.path.join(root, "current", "service.json"), "r", encoding="utf-8") as handle:
            doc = json.load(handle)
    except (IOError, OSError, ValueError):
        return []
    out = []
    for role, m in sorted((doc.get("models") or {}).items()):
        if type(m) is not dict or m.get("layout") not in LAYOUTS or not m.get("root"):
            continue
        if m["layout"] == "folder":
            out.append({"key": role, "layout": "folder", "path": m["root"], "expect_revision": m.get("revision")})
        else:
            out.append({"key": role, "layout": "hf_cache", "cache": m["root"], "repo": m.get("repo"),
                        "revision": m.get("revision")})
    return out


def main(params):
    if params.get("op") == "current":  # what the serving release needs, checked quickly (status, drift, report)
        models = current_models(params["root"])
        return {"models": verify_models(models, "quick", params.get("cache_dir")), "refs": models}
    if params.get("op") == "remove":
        return {"models": [remove_model(m, params["root"]) for m in params["models"]]}
    tier = params.get("tier") or "quick"
    return {"models": verify_models(params["models"], tier, params.get("cache_dir"))}
