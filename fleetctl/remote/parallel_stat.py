# Included by distributions.py (`# fleetctl-include: parallel_stat`): the stat pass of `drift
# --verify-files`, one os.stat per RECORD file, spread over forked processes. A warm check of
# SGLang's closure is 76,000 stats, most of the host's time, and each costs as much in Python (the
# stat_result object) as in the kernel: forked workers run them side by side on a host's idle
# cores. Same stats, same order, same answer as one process. Stdlib only, Python >= 3.8.
import marshal
import os

PARALLEL_MIN_FILES = 20000  # below this a fork costs more than it saves
MAX_WORKERS = 4


def stat_dist(dist, keep_results):
    """(stat results or None, stamps) of ``dist``'s stat targets, in their order: stamps holds
    size, mtime_ns, inode, ctime_ns of each file (None for one that is gone)."""
    site, stat = dist["site"], os.stat
    sts, stamps = [], []
    keep, stamp = sts.append, stamps.extend
    targets, _scripts = stat_targets(dist)
    try:  # stat relative to the site folder: the kernel walks 3 path parts, not 9
        site_fd = os.open(site, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if stat in os.supports_dir_fd else None
    except OSError:
        site_fd = None
    if site_fd is None:  # no dir_fd: every path whole
        targets = [t if t.startswith("/") else site + "/" + t for t in targets]
    try:
        for target in targets:  # relative to site_fd, or absolute (dir_fd is then ignored)
            try:
                st = stat(target, dir_fd=site_fd)
            except OSError:
                st = None
                stamps.append(None)
            else:
                stamp((st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
            if keep_results:
                keep(st)
    finally:
        if site_fd is not None:
            os.close(site_fd)
    return (sts if keep_results else None), stamps


def worker_count():
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


def stamps_in_parallel(dists):
    """[stamps of each dist] (stat_dist's), the dists shared out in runs of about equal file counts
    to forked workers; this process takes the first run. A worker that fails has its run done here."""
    sizes = [len(stat_targets(d)[0]) for d in dists]
    workers = worker_count() if hasattr(os, "fork") and sum(sizes) >= PARALLEL_MIN_FILES else 1
    share, runs, start, acc = sum(sizes) / workers, [], 0, 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= share * (len(runs) + 1) and len(runs) < workers - 1:
            runs.append((start, i + 1))
            start = i + 1
    runs = [run for run in runs + [(start, len(dists))] if run[1] > run[0]] or [(0, 0)]
    children = [fork_stats(dists[a:b]) for a, b in runs[1:]]
    found = [stat_dist(d, False)[1] for d in dists[runs[0][0]:runs[0][1]]]
    for (a, b), child in zip(runs[1:], children):
        part = collect(child, b - a)
        found.extend(part if part is not None else [stat_dist(d, False)[1] for d in dists[a:b]])
    return found


def fork_stats(dists):
    """(pid, read end) of a child that writes marshal of the stamps of ``dists``; None if no fork."""
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:  # the child: stat, answer, leave at once (no cleanup of the parent's state)
        code = 1
        try:
            os.close(read_end)
            data = marshal.dumps([stat_dist(d, False)[1] for d in dists], 2)
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view):]
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def collect(child, count):
    """The child's stamps lists, or None when it failed (then the parent stats them itself)."""
    if child is None:
        return None
    pid, read_end = child
    chunks = []
    try:
        while True:
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        chunks = None
    finally:
        os.close(read_end)
    try:
        _pid, status = os.waitpid(pid, 0)
    except OSError:
        status = 1
    if chunks is None or status != 0:
        return None
    try:
        found = marshal.loads(b"".join(chunks))
    except (EOFError, ValueError, TypeError):
        return None
    if type(found) is not list or len(found) != count or not all(type(s) is list for s in found):
        return None
    return found
