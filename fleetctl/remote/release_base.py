# Host side of a release's identity and removal. Stdlib only, Python >= 3.8.
#
# op "fingerprint": {"site"} -> {"fingerprint": sha256 of every distribution's name and RECORD
#   digest in that site-packages, "distributions": n}. A base repaired or changed by hand (an
#   overlay, a pip install) gets another fingerprint; the same install anywhere gets the same one.
# op "built_from": {"root", "release_id"} -> {"built": bool, "fingerprint": the base fingerprint
#   recorded when that release was built (None for a build older than the record)}
# op "remove": {"root", "state_dir", "release_id"} -> {"removed": path}; refuses current and previous.
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
    shutil.rmtree(folder)
    return {"removed": folder}


def main(params):
    return {"fingerprint": fingerprint, "built_from": built_from, "remove": remove}[params["op"]](params)
