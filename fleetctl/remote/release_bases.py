# Included by release_host.py and release_base.py (`# fleetctl-include: release_bases`): base venvs
# that fleetctl built from a lock (ROOT/bases/<lock hash>/venv) go with the last release that uses
# them. An `adopt` base lies outside ROOT/bases and is never touched. Stdlib only, Python >= 3.8.
#   unused_bases_removed(root) -> the ROOT/bases/<hash> folders removed: no release's manifest
#                                 names a venv in them (every caller holds the host's deploy lock)
import json
import os
import shutil


def bases_in_use(root, without=None):
    """The base venvs the releases' manifests name (``without``: as if that release were gone)."""
    rels = os.path.join(root, "releases")
    used = set()
    for name in os.listdir(rels) if os.path.isdir(rels) else []:
        if name == without:
            continue
        try:
            with open(os.path.join(rels, name, "manifest.json")) as handle:
                base = json.load(handle).get("base_venv")
        except (OSError, ValueError):
            continue  # a build's temporary folder (under the same lock: a dead run's), not a release
        if base:
            used.add(os.path.realpath(base))
    return used


def unused_bases(root, without=None):
    """The ROOT/bases/<hash> folders no release uses (``without``: once that release is gone)."""
    bases = os.path.join(root, "bases")
    used = bases_in_use(root, without)
    unused = []
    for name in sorted(os.listdir(bases)) if os.path.isdir(bases) else []:
        folder = os.path.realpath(os.path.join(bases, name))
        if not os.path.isdir(folder) or any(u == folder or u.startswith(folder + os.sep) for u in used):
            continue
        unused.append(os.path.join(bases, name))
    return unused


def unused_bases_removed(root):
    removed = unused_bases(root)
    for folder in removed:
        shutil.rmtree(folder)
    return removed
