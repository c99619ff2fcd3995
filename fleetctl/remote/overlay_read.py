# Included by overlay_source.py (`# fleetctl-include: overlay_read`): how the source reads its files.
# A large binary (a NUL in its first chunk: never relocated) is hashed for the listing and sent from
# the file in chunks, never held whole; the files no cache answers for are hashed on a few threads
# before the listing's loop. Stdlib only, Python >= 3.8; uses the source's Dist (defined after it,
# called only at run time).
import base64
import hashlib
import os

LARGE = 1 << 20  # from this size a file is looked at first: a binary one is sent from the file
CHUNK = 1 << 20


def binary_file(path, size):
    """A large file with a NUL byte in its first chunk: binary, never relocated (relocate.is_text),
    so its bytes go as they are, without holding the whole file in memory."""
    if size < LARGE:
        return None
    try:
        handle = open(path, "rb")
    except (IOError, OSError):
        return None
    if b"\0" in handle.read(CHUNK):
        handle.seek(0)
        return handle
    handle.close()
    return None


def send_file(sink, rel, handle, size):
    """A large binary's bytes from its open file, exactly the size its header gave."""
    left = size
    while left > 0:
        chunk = handle.read(min(CHUNK, left))
        if not chunk:
            raise IOError("%s shrank on the source while sending" % rel)
        sink.write(chunk)
        left -= len(chunk)


def binary_digest(path, size):
    """(urlsafe sha256, size) of a large binary file (binary_file's rule: never relocated, sent as it
    is), read in chunks; None for a small or a text file, or one that cannot be read (then read whole,
    as before, which says it is missing)."""
    try:
        handle = binary_file(path, size)
        if handle is None:
            return None
        h, total = hashlib.sha256(), 0
        with handle:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                h.update(chunk)
                total += len(chunk)
    except (IOError, OSError):
        return None
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode("ascii"), total


AHEAD_MIN_BYTES = 1 << 24  # below this the files are hashed in turn: threads would cost more than they save


def hash_ahead(dists):
    """The files no cache answers for, hashed on a few threads before the listing's loop (sha256 and
    reads let go of the GIL): a fresh source's first listing of a 10 GB venv was ~25 s on one core
    while the others waited. Each Dist keeps its answers (``ahead``) for describe()."""
    todo = [(dist, rel, where) for dist in dists for rel, where in dist.places()
            if where[0] is not None and dist.needs_reading(where)]
    workers = min(4, os.cpu_count() or 1)
    if workers < 2 or len(todo) < 2 or sum(w[1].st_size for _d, _r, w in todo) < AHEAD_MIN_BYTES:
        return
    from concurrent.futures import ThreadPoolExecutor

    todo.sort(key=lambda item: -item[2][1].st_size)  # the largest first: no thread is left with one at the end
    with ThreadPoolExecutor(max_workers=workers) as pool:
        found = list(pool.map(lambda item: item[0].digest(item[1], item[2]), todo))
    for (dist, rel, _where), answer in zip(todo, found):
        dist.ahead[rel] = answer
