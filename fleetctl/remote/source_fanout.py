"""The forked workers of ``source.py`` (grep and symbol over many files): the files shared out in
chunks taken from a queue, one worker per usable CPU, each answer marshalled back over a pipe.
Included by source.py (``# fleetctl-include``); stdlib only, Python >= 3.8."""

import marshal
import os


MAX_WORKERS = 8  # a GPU host's CPUs belong to its inference server: a probe takes a few, briefly
FILES_PER_WORKER = 300  # below this a forked worker costs more than it saves


def worker_count(params, files):
    """params["workers"] when given, else one per usable CPU that is not busy (as rg, less the
    1-minute load average, as make -l), bounded by the amount of work. A worker forked onto a
    busy CPU only adds its fork and copy: 32 hosts searching at once on 2 shared CPUs used 25 ms
    more CPU per host with two workers than with one."""
    if params.get("workers"):
        return max(int(params["workers"]), 1)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        idle = cpus - int(os.getloadavg()[0])
    except (AttributeError, OSError):
        idle = cpus
    return max(1, min(cpus, idle, MAX_WORKERS, files // FILES_PER_WORKER))


MAX_CHUNKS = 255  # one byte per chunk number, all written at once: fits any pipe (PIPE_BUF >= 512)


def fan_out(work, items, workers):
    """[work(chunk) for each chunk of items], in no particular order, the chunks shared out among
    ``workers`` forked children.

    Searching is CPU-bound Python (bytes.find and ast hold the GIL), so threads would not help;
    fork shares the compiled matchers without pickling. The items are cut into contiguous chunks
    (up to MAX_CHUNKS) whose numbers wait in a pipe; each child takes the next number when it is
    done with a chunk, so a slow one (big files, a busy CPU) takes fewer. Each child sees its
    chunks in increasing order, so state that a ``work`` closure keeps across its calls (a budget
    of listed lines) follows the order of items. This process only hands out and collects: all
    workers alike (none pays for copy-on-write of the parent's heap more than another).
    Without fork, or when not even one child can be started: every chunk, in order, in-process.
    """
    if fan_out_width(items, workers) == 1:
        return [work(items)]
    size = max(1, -(-len(items) // MAX_CHUNKS))
    chunks = [items[i:i + size] for i in range(0, len(items), size)]
    queue_r, queue_w = os.pipe()
    try:
        os.write(queue_w, bytes(range(len(chunks))))  # <= 255 bytes: one atomic write, never blocks
    finally:
        os.close(queue_w)
    children, results = [], []
    try:
        try:
            for _ in range(workers):
                try:
                    children.append(fork_worker(lambda: take_chunks(work, chunks, queue_r)))
                except OSError:  # no more processes: the ones there are take more chunks
                    break
            if not children:
                results.extend(take_chunks(work, chunks, queue_r))
        finally:
            os.close(queue_r)
    finally:
        answers = [collect_worker(pid, fd) for pid, fd in children]  # every child reaped, come what may
    for status, value in answers:
        if status != "ok":
            raise RuntimeError("a search worker failed: %s" % value)
        results.extend(value)
    return results


def fan_out_width(items, workers):
    """How many processes fan_out shares items among."""
    return workers if workers > 1 and len(items) > 1 and hasattr(os, "fork") else 1


def take_chunks(work, chunks, queue_r):
    """[work(chunk)] for each chunk number this process takes from the queue, until it is empty."""
    out = []
    while True:
        number = os.read(queue_r, 1)
        if not number:
            return out
        out.append(work(chunks[number[0]]))


def fork_worker(work):
    """(pid, read end of its answer pipe) of a child that runs work() and sends back what it returns."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_fd)
        return pid, read_fd
    code = 0  # the child: answer through the pipe, then leave without running any cleanup of the parent's
    try:
        os.close(read_fd)
        blob = marshal.dumps(("ok", work()))
    except BaseException as exc:
        blob, code = marshal.dumps(("error", "%s: %s" % (type(exc).__name__, exc))), 1
    try:
        view = memoryview(blob)
        while view:
            view = view[os.write(write_fd, view):]
    finally:
        os._exit(code)


def collect_worker(pid, fd):
    chunks = []
    try:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    try:
        return marshal.loads(b"".join(chunks))
    except (EOFError, ValueError, TypeError):
        return "error", "pid %d died without an answer" % pid
