# fleetctl-include: release_bases
# Host side of a release's identity and removal. Stdlib only, Python >= 3.8.
#
# op "fingerprint": {"site"} -> {"fingerprint": sha256 of every distribution's name and RECORD
#   digest in that site-packages, "distributions": n}. A base repaired or changed by hand (an
#   overlay, a pip install) gets another fingerprint; the same install anywhere gets the same one.
# op "built_from": {"root", "release_id"} -> {"built": bool, "fingerprint": the base fingerprint
#   recorded when that release was built (None for a build older than the record)}
# op "remove": {"root", "state_dir", "release_id", "prune_bases", "check"} -> {"removed": path, "bases_removed":
#   the ROOT/bases/<hash> folders no release uses any more, when prune_bases}; refuses current and previous;
#   "check": the same answer (and refusals), nothing removed.
# op "stage": {"root", "release_id", "record"} -> {"verified": n}: every patched and kernel file of the
#   built release checked against its manifest's sha256 (a mismatch is a ValueError naming the file),
#   then RELEASE/staged.json written with the record (spec digest, base site, launch check).
# op "staged": {"root", "release_id", "spec_digest"} -> {"release_id": the staged build of that spec
#   whose base is unchanged since (the spec's id or its .b<fingerprint> rebuild), or None, "why"}
import hashlib
import json
import os
import shutil


def fingerprint(params):
    site = params["site"]
    rows = []
    for name in sorted(os.listdir(site)) if os.path.isdir(site) else []:
        if not name.endswith(".dist-info"):
            continue
        try:
            with open(os.path.join(site, name, "RECORD"), "rb") as handle:
                rows.append("%s %s" % (name, hashlib.sha256(handle.read()).hexdigest()))
        except OSError:
            rows.append("%s -" % name)  # no RECORD: still part of what the base is
    digest = hashlib.sha256("\n".join(rows).encode("utf-8")).hexdigest()
    return {"fingerprint": digest, "distributions": len(rows)}


def release_folder(params):
    release_id = params["release_id"]
    if not release_id or "/" in release_id or release_id.startswith("."):
        raise ValueError("bad release id %r" % (release_id,))
    return os.path.join(params["root"], "releases", release_id)


def built_from(params):
    try:
        with open(os.path.join(release_folder(params), "manifest.json")) as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        return {"built": False, "fingerprint": None}
    return {"built": True, "fingerprint": manifest.get("base_fingerprint")}


def remove(params):
    folder = release_folder(params)
    root = params["root"]
    current = os.path.basename(os.path.realpath(os.path.join(root, "current"))) \
        if os.path.islink(os.path.join(root, "current")) else None
    try:
        with open(os.path.join(params["state_dir"], "state.json")) as handle:
            previous = json.load(handle).get("previous")
    except (OSError, ValueError):
        previous = None
    if params["release_id"] in (current, previous):
        raise ValueError("release %s is the %s one: roll back or deploy another first"
                         % (params["release_id"], "current" if params["release_id"] == current else "previous"))
    if not os.path.isdir(folder):
        raise ValueError("no release %s on this host" % params["release_id"])
    if params.get("check"):  # what would go, nothing removed
        bases = unused_bases(root, params["release_id"]) if params.get("prune_bases", True) else []
        return {"removed": folder, "bases_removed": bases, "check": True}
    shutil.rmtree(folder)
    bases = unused_bases_removed(root) if params.get("prune_bases", True) else []
    return {"removed": folder, "bases_removed": bases}


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def stage(params):
    folder = release_folder(params)
    with open(os.path.join(folder, "manifest.json")) as handle:
        manifest = json.load(handle)
    checked = [(os.path.join(folder, "venv", rel), want) for rel, want in (manifest.get("venv_files") or {}).items()]
    checked += [(os.path.join(folder, rel), want) for rel, want in (manifest.get("kernel_files") or {}).items()]
    checked.append((os.path.join(folder, "venv", "bin", "python"), None))
    for path, want in checked:
        if not os.path.exists(path):
            raise ValueError("staged release %s is missing %s" % (params["release_id"], path))
        if want is not None and _sha256(path) != want:
            raise ValueError("staged release %s: %s differs from its manifest" % (params["release_id"], path))
    record = dict(params.get("record") or {}, base_fingerprint=manifest.get("base_fingerprint"))
    tmp = os.path.join(folder, ".staged.json.tmp")
    with open(tmp, "w") as handle:
        json.dump(record, handle)
    os.rename(tmp, os.path.join(folder, "staged.json"))
    return {"verified": len(checked)}


def staged(params):
    rels = os.path.join(params["root"], "releases")
    rid = params["release_id"]
    names = sorted(n for n in (os.listdir(rels) if os.path.isdir(rels) else []) if n == rid or n.startswith(rid + ".b"))
    why = "not staged on this host"
    for name in names:
        try:
            with open(os.path.join(rels, name, "staged.json")) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if record.get("spec_digest") != params["spec_digest"]:
            why = "staged %s is of another spec" % name
            continue
        if fingerprint({"site": record.get("site") or ""})["fingerprint"] != record.get("base_fingerprint"):
            why = "the base changed since %s was staged" % name
            continue
        return {"release_id": name, "record": record, "why": ""}
    return {"release_id": None, "record": None, "why": why}


def main(params):
    ops = {"fingerprint": fingerprint, "built_from": built_from, "remove": remove, "stage": stage, "staged": staged}
    return ops[params["op"]](params)
