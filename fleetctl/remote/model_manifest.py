# A model revision's manifest: every file's relative path, size and sha256. Stdlib only, Python >= 3.8;
# included by the host-side model modules (`# fleetctl-include: model_manifest`) and loaded as is by the
# controller (fleetctl/models/manifest.py), so host and controller read and write one format.
#
# Where it is kept, beside the model on each host:
#   plain folder:  <folder>/.fleetctl-manifest.json
#   HF cache:      <cache>/models--ORG--NAME/.fleetctl/<40-hex revision>.manifest.json
#                  (one per snapshot, outside snapshots/ so that the Hub's tools see only the Hub's files)
#
# Hashes: a HF cache blob named by 64 hex digits is an LFS file named by its sha256, taken from the name
# (the full verification proves it); a blob named by 40 hex digits is a git-sha1 (small files: config,
# tokenizer), hashed here and its git_sha1 kept; a plain folder's files are hashed once, at the source.
import hashlib
import json
import os
import re

SCHEMA = "fleetctl-model-manifest/1"
FOLDER_MANIFEST = ".fleetctl-manifest.json"
HF_MANIFEST_DIR = ".fleetctl"
LAYOUTS = ("folder", "hf_cache")
SHA256_NAME = re.compile(r"^[0-9a-f]{64}$")
SHA1_NAME = re.compile(r"^[0-9a-f]{40}$")
CHUNK = 4 << 20
# Not part of a plain folder's model: fleetctl's own files, huggingface_hub's local_dir metadata.
FOLDER_SKIP = (FOLDER_MANIFEST, ".cache", ".fleetctl", ".fleetctl-tmp")


class ManifestError(ValueError):
    """A manifest that cannot be read or is not one; the text names the file."""


class BlobMismatch(ManifestError):
    """A small HF blob whose bytes are not those its git-sha1 name says."""

    def __init__(self, rel, blob, found):
        ManifestError.__init__(self, "git-sha1 %s..., its blob name says %s..." % (found[:12], blob[:12]))
        self.rel = rel


def sha256_file(path, progress=None):
    """``progress(n)``, if given, is told of every n bytes read (model_host's progress frames)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return digest.hexdigest()


def git_sha1_file(path, size):
    """The git blob id of a file: sha1 of 'blob <size>\\0' and the bytes (the Hub's etag of a small file)."""
    digest = hashlib.sha1(("blob %d\0" % size).encode("ascii"))
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def hf_repo_folder(repo):
    """models--ORG--NAME for ORG/NAME (case kept, as huggingface_hub names it)."""
    return "models--" + repo.replace("/", "--")


def hf_snapshot(cache, repo, revision):
    return os.path.join(cache, hf_repo_folder(repo), "snapshots", revision)


def manifest_path(layout, root, repo=None, revision=None):
    """Where the manifest of a model is kept. ``root``: the folder, or the HF cache."""
    if layout == "folder":
        return os.path.join(root, FOLDER_MANIFEST)
    return os.path.join(root, hf_repo_folder(repo), HF_MANIFEST_DIR, "%s.manifest.json" % revision)


def model_files(base):
    """Relative paths of the model's files under ``base`` (a folder or a snapshot), sorted; fleetctl's
    files and huggingface_hub's .cache left out at the top."""
    found = []
    for folder, dirs, files in os.walk(base, followlinks=False):
        rel_dir = os.path.relpath(folder, base)
        top = rel_dir == "."
        dirs[:] = sorted(d for d in dirs if not (top and d in FOLDER_SKIP))
        for name in files:
            if top and name in FOLDER_SKIP:
                continue
            found.append(name if top else os.path.join(rel_dir, name))
    return sorted(found)


def content_id(files):
    """A digest of the file list (paths, sizes, sha256): a plain folder's revision, equal on every host
    holding the same bytes."""
    text = "\n".join("%s\t%d\t%s" % (f["path"], f["size"], f["sha256"]) for f in files)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def new_manifest(name, revision, layout, files, repo=None):
    doc = {"schema": SCHEMA, "name": name, "revision": revision, "layout": layout,
           "total_bytes": sum(f["size"] for f in files), "files": files}
    if repo:
        doc["repo"] = repo
    return doc


def build_from_folder(folder, name=None, revision=None, hash_of=sha256_file):
    """The manifest of a plain folder, every file hashed (``hash_of``: a hash store may know some).
    ``revision``: a label the spec gives; the content id (sha256 over the file list) when none."""
    folder = os.path.abspath(folder)
    files = []
    for rel in model_files(folder):
        path = os.path.join(folder, rel)
        if os.path.islink(path) and not os.path.isfile(path):
            raise ManifestError("%s: a symlink to nothing" % path)
        files.append({"path": rel, "size": os.path.getsize(path), "sha256": hash_of(path)})
    return new_manifest(name or os.path.basename(folder), revision or content_id(files), "folder", files)


def build_from_hf_cache(cache, repo, revision):
    """The manifest of one snapshot of a HF cache: sha256 from 64-hex blob names, small git blobs hashed."""
    snapshot = hf_snapshot(cache, repo, revision)
    if not os.path.isdir(snapshot):
        raise ManifestError("%s: no such snapshot" % snapshot)
    blobs = os.path.realpath(os.path.join(cache, hf_repo_folder(repo), "blobs"))
    files = []
    for rel in model_files(snapshot):
        path = os.path.join(snapshot, rel)
        real = os.path.realpath(path)
        if not os.path.isfile(real):
            raise ManifestError("%s: a symlink to nothing" % path)
        size = os.path.getsize(real)
        blob = os.path.basename(real) if os.path.dirname(real) == blobs else ""
        entry = {"path": rel, "size": size}
        if SHA256_NAME.match(blob):
            entry["sha256"] = blob
        else:
            entry["sha256"] = sha256_file(real)
            if SHA1_NAME.match(blob):
                found = git_sha1_file(real, size)
                if found != blob:  # a small file proves itself against its name: no hash is taken from bad bytes
                    raise BlobMismatch(rel, blob, found)
                entry["git_sha1"] = blob
        files.append(entry)
    return new_manifest(repo, revision, "hf_cache", files, repo=repo)


def check(doc, where):
    """``doc`` as a manifest, or ManifestError naming ``where``."""
    if type(doc) is not dict or doc.get("schema") != SCHEMA:
        raise ManifestError("%s: not a fleetctl model manifest (schema %s)" % (where, SCHEMA))
    if doc.get("layout") not in LAYOUTS:
        raise ManifestError("%s: layout must be one of %s" % (where, ", ".join(LAYOUTS)))
    for key in ("name", "revision"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise ManifestError("%s: %s must be a non-empty string" % (where, key))
    files = doc.get("files")
    if type(files) is not list:
        raise ManifestError("%s: files must be a list" % where)
    seen = set()
    for i, entry in enumerate(files):
        path = entry.get("path") if type(entry) is dict else None
        ok = (isinstance(path, str) and path and not path.startswith("/") and ".." not in path.split("/")
              and type(entry.get("size")) is int and entry["size"] >= 0
              and isinstance(entry.get("sha256"), str) and SHA256_NAME.match(entry["sha256"]))
        if not ok:
            raise ManifestError("%s: files[%d] needs a relative path, a size and a 64-hex sha256" % (where, i))
        if path in seen:
            raise ManifestError("%s: %s listed twice" % (where, path))
        seen.add(path)
    doc["total_bytes"] = sum(f["size"] for f in files)
    return doc


def loads(text, where):
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ManifestError("%s: not valid JSON (%s)" % (where, exc))
    return check(doc, where)


def load(path):
    try:
        with open(path, "r", encoding="utf-8") as handle:
            text = handle.read()
    except (IOError, OSError) as exc:
        raise ManifestError("%s: %s" % (path, exc.strerror or exc))
    return loads(text, path)


def dumps(doc):
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def dump(doc, path):
    """Write the manifest atomically (a temporary name, then rename), readable by all."""
    check(doc, path)
    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        os.makedirs(folder, 0o755)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(dumps(doc))
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)
    return path
