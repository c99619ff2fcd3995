# What a `models sync` of an older fleetctl left in a Hugging Face cache's snapshots/. Included by
# model_files (sync) and model_host (remove); stdlib only, Python >= 3.8.
#
# Before e2fc1e9 a snapshot was staged beside itself, in <repo>/snapshots/.<revision>.fleetctl-partial/,
# its lock the file <repo>/snapshots/.<revision>.fleetctl-partial.lock (written through
# .lock.<pid>.tmp). A sync killed then left them there, where huggingface_hub's scan_cache_dir (behind
# `hf cache ls` and `hf cache rm`) lists the folder as a revision, and a file as a corrupted cache (the
# whole repo then drops out of its list). Today staging lives in <repo>/.fleetctl/partial/ (model_files).
# An entry is ours by its name alone (a dot, then a name, then .fleetctl-partial; a real snapshot is a
# 40-hex commit, never a dot name); it is removed only while no process still holds its old lock.
import json
import os
import shutil

OLD_STAGING_SUFFIX = ".fleetctl-partial"


def pid_start(pid):
    """Start time (clock ticks since boot) of a live process on this host, None when it is not running."""
    try:
        with open("/proc/%d/stat" % int(pid), "r") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (IOError, OSError, ValueError, IndexError):
        return None
    return None if len(fields) < 20 or fields[0] in ("Z", "X") else fields[19]


def old_staging_of(name):
    """The old staging folder's name an entry of snapshots/ belongs to, None when it is not ours."""
    if not name.startswith(".") or OLD_STAGING_SUFFIX not in name:
        return None
    base, rest = name.split(OLD_STAGING_SUFFIX, 1)
    ours = rest in ("", ".lock") or (rest.startswith(".lock.") and rest.endswith(".tmp"))
    return base + OLD_STAGING_SUFFIX if ours and len(base) > 1 else None


def old_lock_held(lock):
    """A process on this host still holds this old-style lock (its pid runs, started when the lock says)."""
    try:
        with open(lock, "r", encoding="utf-8") as handle:
            doc = json.load(handle)
        start = pid_start(doc["pid"])
    except (IOError, OSError, ValueError, KeyError, TypeError):
        return False
    return start is not None and doc.get("pid_start") in (None, start)


def entry_bytes(path):
    if os.path.isdir(path) and not os.path.islink(path):
        return sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(path) for f in fs)
    return os.lstat(path).st_size


def sweep_old_staging(repo_dir):
    """Remove what an older fleetctl's killed syncs left in ``repo_dir``/snapshots/ (never a real snapshot,
    never one an old sync still runs in). Returns ([paths removed], bytes freed)."""
    snapshots = os.path.join(repo_dir, "snapshots")
    try:
        names = sorted(os.listdir(snapshots))
    except OSError:
        return [], 0
    groups = {}
    for name in names:
        staging = old_staging_of(name)
        if staging is not None:
            groups.setdefault(staging, []).append(name)
    removed, freed = [], 0
    for staging, entries in sorted(groups.items()):
        if old_lock_held(os.path.join(snapshots, staging + ".lock")):
            continue  # an older fleetctl syncs into it now
        for name in entries:
            path = os.path.join(snapshots, name)
            try:
                freed += entry_bytes(path)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            except OSError:
                continue
            removed.append(path)
    return removed, freed
