# fleetctl-include: relocate
# fleetctl-include: host_files
# fleetctl-include: writable
# fleetctl-include: release_bases
# fleetctl-include: release_switch
# fleetctl-include: release_lock
"""Release folders on one host: inspect, build, switch atomically, prune; and the per-host lock.

Stdlib only, Python >= 3.8; runs inside the agent (root privileges of the SSH user).
Layout (ROOT defaults to /opt/fleetctl, STATE to /var/lib/fleetctl):
  ROOT/releases/<id>/venv/          a complete venv cloned from the base (hard links where possible)
  ROOT/releases/<id>/manifest.json  release id, spec digest, sha256 of every patched or added file
  ROOT/releases/<id>/service.env    the service environment (mode 0600)
  ROOT/current -> releases/<id>     switched by renaming a new symlink over the old one
  STATE/state.json                  current, the history of switches, releases rejected or passed
  STATE/deploy.lock                 flock held by the agent of the run that deploys (dies with it)
A release folder is built under a temporary name and renamed into place when complete, so a
folder named like a release is always whole. Patched files are new files renamed into place:
an inode shared (hard-linked) with another release is never written.
"""

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import time

class DiskFull(Exception):
    """The filesystem holding the releases (a build) or the state folder (lock, state) is full."""


def disk_full(exc):
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def full_message(path, after):
    return "no space left on device in %s (writing %s); %s" % (os.path.dirname(path), os.path.basename(path), after)


def main(params):
    op = params.get("op")
    handler = OPS.get(op)
    if handler is None:
        raise ValueError("unknown release_host op %r" % (op,))
    return handler(params)


def op_inspect(params):
    """The base venv (python, site-packages, versions of the asked distributions, the files a
    patch needs) and the host's release state, in one answer."""
    base = params.get("base_venv")
    answer = {"state": op_state(params), "base": None}
    if not base:
        return answer
    python = os.path.join(base, "bin", "python")
    if not os.path.exists(python):
        answer["base"] = {"exists": False, "path": base}
        return answer
    info = json.loads(run_child(python, VENV_PROBE, json.dumps(params.get("dists") or [])))
    files = {}
    for rel in params.get("files") or []:
        files[rel] = read_text(safe_join(info["site"], rel))
    info.update(exists=True, path=base, files=files)
    answer["base"] = info
    return answer


# Asked of the base venv's own interpreter: where its site-packages is and what is installed.
VENV_PROBE = r"""
import json, sys, sysconfig
try:
    from importlib import metadata
except ImportError:
    metadata = None
names = json.loads(sys.argv[1])
versions = {}
for name in names:
    try:
        versions[name] = metadata.version(name) if metadata else None
    except Exception:
        versions[name] = None
print(json.dumps({"site": sysconfig.get_paths()["purelib"], "python": sys.executable,
                  "version": "%d.%d.%d" % sys.version_info[:3], "prefix": sys.prefix, "dists": versions}))
"""


def run_child(python, code, arg):
    import subprocess

    proc = subprocess.run([python, "-c", code, arg], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError("%s failed: %s" % (python, proc.stderr.decode("utf-8", "replace").strip()[-500:]))
    return proc.stdout.decode("utf-8")


def safe_join(root, rel):
    """``root/rel``, refusing any path that leaves ``root``."""
    path = os.path.normpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not (path + "/").startswith(os.path.normpath(root) + "/"):
        raise ValueError("path %r leaves %s" % (rel, root))
    return path


def read_text(path):
    try:
        with open(path, "r", encoding="utf-8", newline="") as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def read_json(path):
    text = read_text(path)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def write_json(path, data, mode=0o644):
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode("utf-8"), mode)


# --- state --------------------------------------------------------------------------------------

def releases_dir(params):
    return os.path.join(params["root"], "releases")


def current_id(root):
    try:
        target = os.readlink(os.path.join(root, "current"))
    except OSError:
        return None
    return os.path.basename(target.rstrip("/"))


def op_state(params):
    root, rels = params["root"], releases_dir(params)
    state = read_json(os.path.join(params["state_dir"], "state.json")) or {}
    releases = []
    for name in sorted(os.listdir(rels)) if os.path.isdir(rels) else []:
        manifest = read_json(os.path.join(rels, name, "manifest.json"))
        if name.startswith(".") or manifest is None:
            continue  # a temporary folder of a build that did not finish
        served = read_json(os.path.join(rels, name, "service.json"))
        # The servers it runs (names_of on the controller): a rollback switches and restarts them in one go.
        releases.append({"id": name, "created": manifest.get("created"), "spec_digest": manifest.get("spec_digest"),
                         "service": None if served is None else {"instances": served.get("instances")}})
    releases.sort(key=lambda r: r.get("created") or 0)
    service = read_json(os.path.join(root, "current", "service.json")) or {}
    service.pop("unit", None)
    current = current_id(root)
    return dict(history_view(state, current, {r["id"] for r in releases}), current=current, releases=releases,
                hostname=socket.gethostname(), service=service)


# --- build --------------------------------------------------------------------------------------

def op_build(params):
    """Clone the base venv into a new release folder, patch it, write env + manifest, publish."""
    refuse_standin_off_the_lab(params)  # before any work: nothing of it is left on the host
    rels = releases_dir(params)
    final = os.path.join(rels, params["release_id"])
    existing = read_json(os.path.join(final, "manifest.json"))
    if existing and existing.get("spec_digest") == params["manifest"]["spec_digest"]:
        write_host_files(final, params)  # host settings (address, env) may change without the release
        return {"built": False, "path": final, "reason": "already built"}
    if existing or os.path.exists(final):
        raise RuntimeError("%s exists but holds another build of that id; remove it first" % final)
    os.makedirs(rels, exist_ok=True)
    tmp = os.path.join(rels, ".%s.tmp-%d" % (params["release_id"], os.getpid()))
    clear_stale_tmp(rels, params["release_id"])
    started = time.time()
    try:
        venv = os.path.join(tmp, "venv")
        stats = clone_tree(params["base_venv"], venv, os.path.join(final, "venv"), params.get("links", True))
        stats["relocated"] = relocate_clone(venv, params["base_venv"], os.path.join(final, "venv"))
        # base_venv: a base built from a lock goes with the last release that names it (release_bases)
        manifest = dict(params["manifest"], created=time.time(), venv_files={}, base_venv=params["base_venv"])
        site_rel = os.path.relpath(params["site"], params["base_venv"])
        for rel, text in sorted((params.get("files") or {}).items()):
            path = safe_join(os.path.join(venv, site_rel), rel)
            if text is None:
                if os.path.lexists(path):
                    os.unlink(path)
                continue
            data = text.encode("utf-8")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write(path, data, file_mode(path))
            manifest["venv_files"][os.path.join(site_rel, rel)] = hashlib.sha256(data).hexdigest()
        write_host_files(tmp, params)
        if params.get("kernel_files"):  # fleetctl kernels: the folder SGLANG_MOE_CONFIG_DIR names
            manifest["kernel_files"] = write_kernel_files(tmp, params["kernel_files"])
        write_json(os.path.join(tmp, "manifest.json"), manifest)
        os.rename(tmp, final)  # published whole
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed build leaves no temporary folder behind
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            written = str(exc.filename2 or exc.filename or "?")  # copies name the source first, the target second
            where = os.path.relpath(written, tmp) if written.startswith(tmp + "/") else written
            raise DiskFull("no space left on device in %s (writing %s of release %s); the partial release "
                           "was removed, nothing switched" % (rels, where, params["release_id"]))
        raise
    return dict(stats, built=True, path=final, seconds=round(time.time() - started, 2))


def write_kernel_files(folder, files):
    """Fused-MoE configs (built-in merged with tuned) as FOLDER/kernels/configs/<triton_X_Y_Z>/<name>;
    answers their sha256 by path relative to FOLDER, for the manifest."""
    sums = {}
    top = os.path.join(folder, "kernels", "configs")
    for rel, text in sorted(files.items()):
        path = safe_join(top, rel)
        data = text.encode("utf-8")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:  # a new folder, published whole by the build's rename
            handle.write(data)
        sums[os.path.relpath(path, folder)] = hashlib.sha256(data).hexdigest()
    return sums


def file_mode(path):
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o644


def clear_stale_tmp(rels, release_id):
    prefix = ".%s.tmp-" % release_id
    for name in os.listdir(rels):
        if name.startswith(prefix):
            shutil.rmtree(os.path.join(rels, name), ignore_errors=True)


def clone_tree(src, dst, label, links=True):
    """Hard-link every file of ``src`` into ``dst`` where link() can (one filesystem and one mount),
    copy it otherwise; ``label``: the path ``dst`` is published as, for the message. Answers the
    counts and ``clone``, which says which it did and why it copied: it could not link, or it chose
    not to (``links`` false). A patch never writes through a link: it writes a new file."""
    stats = {"linked": 0, "copied": 0, "link_limit": 0,
             "copy_reason": None if links else "links off: the spec's base.links is false"}
    state = {"link": bool(links), "src": src, "label": label}
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        target_dir = os.path.normpath(os.path.join(dst, rel))
        os.makedirs(target_dir, exist_ok=True)
        shutil.copystat(root, target_dir)
        for name in dirs + files:
            source, target = os.path.join(root, name), os.path.join(target_dir, name)
            if os.path.islink(source):
                os.symlink(os.readlink(source), target)
            elif name in files:
                clone_file(source, target, state, stats)
    stats["clone"] = clone_text(stats)
    return stats


def clone_file(source, target, state, stats):
    if state["link"]:
        try:
            os.link(source, target)
            stats["linked"] += 1
            return
        except OSError as exc:
            if exc.errno == errno.EMLINK:  # this inode is at its filesystem's link limit: copy it alone
                stats["link_limit"] += 1
            elif exc.errno in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                state["link"] = False  # the same answer for every other file: copy the rest
                stats["copy_reason"] = cannot_link(exc, state["src"], state["label"])
            else:
                raise
    shutil.copy2(source, target)
    stats["copied"] += 1


def cannot_link(exc, src, dst):
    if exc.errno == errno.EXDEV:  # another filesystem, or another mount (a bind mount) of the same one
        return "cannot link across filesystems: %s and %s" % (src, dst)
    return "cannot link %s into %s: %s" % (src, dst, os.strerror(exc.errno))


def clone_text(stats):
    """``linked N files``, ``copied (WHY)``, or both, for the deploy table and --json."""
    parts = ["linked %d files" % stats["linked"]] if stats["linked"] or not stats["copied"] else []
    if stats["copied"]:
        why = [stats["copy_reason"]] if stats["copy_reason"] else []
        if stats["link_limit"]:
            why.append("%d at their filesystem's link limit" % stats["link_limit"])
        parts.append("copied" + (" %d files" % stats["copied"] if parts else "")
                     + (" (%s)" % "; ".join(why) if why else ""))
    return ", ".join(parts)


def relocate_clone(venv, old_prefix, new_prefix):
    """Make the clone work at its new path: scripts and activate files in bin/, pyvenv.cfg and .pth
    files naming the old prefix are rewritten (new files: never through a link shared with the
    base), and the RECORD rows of rewritten files rehashed, so drift sees a clean venv. Unlike the
    overlay, site-packages is not scanned whole: a multi-GB venv must clone in seconds."""
    candidates = [os.path.join(venv, "pyvenv.cfg")]
    bindir = os.path.join(venv, "bin")
    candidates += [os.path.join(bindir, n) for n in sorted(os.listdir(bindir))] if os.path.isdir(bindir) else []
    sites = site_packages_of(venv)
    for site in sites:
        candidates += [os.path.join(site, n) for n in sorted(os.listdir(site)) if n.endswith(".pth")]
    changed = [p for p in candidates if os.path.isfile(p) and not os.path.islink(p)
               and relocate_file(p, old_prefix, new_prefix)]
    for site in sites:
        for entry in sorted(os.listdir(site)):
            if entry.endswith(".dist-info"):
                rewrite_record(os.path.join(site, entry), changed)
    return len(changed)


def op_files(params):
    """sha256 of every file under a folder (tests and check mode compare before/after)."""
    out = {}
    top = params["path"]
    for root, _dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                with open(path, "rb") as handle:
                    out[os.path.relpath(path, top)] = hashlib.sha256(handle.read()).hexdigest()
    return out


OPS = {"lock": op_lock, "unlock": op_unlock, "inspect": op_inspect, "state": op_state, "build": op_build,
       "switch": op_switch, "verdict": op_verdict, "prune": op_prune, "files": op_files,
       "config": op_config}
