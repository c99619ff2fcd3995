# fleetctl-include: relocate
# fleetctl-include: venvinfo
# fleetctl-include: writable
# fleetctl-include: overlay_tar
# fleetctl-include: overlay_apply
# fleetctl-include: overlay_calls
# The target side of `fleetctl venv overlay`, run by the target venv's own python.
#
# Stdlib only, Python >= 3.8. Two entry points:
#   main({"action": "list", "names": [dist], "trees": {name: [dist_info, tree]}}) (an agent call,
#     read-only): this interpreter, every dist-info of those distributions, whether it matches
#     the source's tree hash, and the RECORD paths of those that do not (zlib+base64 packed).
#     With {"own_trees": true, "packages": [glob]} instead: each dist-info's own tree hash (run
#     while the source lists; the controller compares).
#   main({"action": "hashes", "paths_z": packed [rel]}): the sha256 of each path that exists (of a
#     dist-info's RECORD: comparable_record_hash, its rows without bytecode, as the source sends it).
#   stream_main() (`python -c`, over its own exec channel): answers the listing calls above first
#     (overlay_calls), then reads one length-prefixed JSON plan from stdin, then the tar the source
#     streams, and applies it in an order that a dropped connection cannot turn into a hybrid
#     (apply()). Prints one delimited JSON answer on stdout. With a "direct" entry in the plan the target does not read the tar
#     from stdin: it runs the given ssh argv itself (the source host's own overlay_source stream
#     command), sends it the source's params and reads the framed stream from its stdout.
import base64
import contextlib
import email.parser
import errno
import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import zlib
from stat import S_ISREG

BEGIN = "@@FLEETCTL-JSON-BEGIN@@"
END = "@@FLEETCTL-JSON-END@@"
STREAM_MAGIC = b"\x00FLEETCTL-OVERLAY-1\n"


def listing(params):
    """Each dist-info of `names`; `match` when it is the source's dist-info and the tree hash over
    the files its RECORD lists equals the source's (then its file list is left out).
    With `own_trees` (and `packages` globs instead of names) it runs before the source's listing
    has come: each dist-info's own tree hash, no file lists; the controller compares."""
    info = interpreter()
    site, names, trees = info["site"], set(params.get("names") or []), params.get("trees") or {}
    own, patterns = bool(params.get("own_trees")), params.get("packages") or []
    cache = HashCache(user_cache_dir(params.get("cache_dir") or "/var/lib/fleetctl/cache", "cache"), info["prefix"])
    dists = {}
    for entry in sorted(os.listdir(site)) if os.path.isdir(site) else []:
        folder = os.path.join(site, entry)
        if not (entry.endswith(".dist-info") and os.path.isdir(folder)):
            continue
        name, version = dist_name(folder, entry)
        if not (wanted(normalize(name), patterns) if own else normalize(name) in names):
            continue
        rows = [os.path.normpath(row[0]) for row in read_record(folder) if not is_bytecode(row[0])]
        item = {"version": version, "dist_info": entry}
        if own:
            item["tree"] = tree_of(site, entry, rows, cache)
        else:
            want = trees.get(normalize(name))
            item["match"] = bool(want and want[0] == entry and tree_of(site, entry, rows, cache) == want[1])
            if not item["match"]:
                item["files_z"] = pack_json(rows)
        dists.setdefault(normalize(name), []).append(item)
    cache.save()
    return {"schema": 1, "interpreter": info, "dists": dists,
            "inflight": os.path.exists(journal_path(info["prefix"], params.get("state_dir")))}


def tree_of(site, entry, rows, cache):
    """The tree hash over the files `rows` lists, as overlay_source computes it for what it would
    send: RECORD by its rows (comparable_record_hash), not its bytes."""
    entries = []
    for rel in rows:
        if rel == entry + "/RECORD":
            continue
        digest = cached_hash(cache, os.path.join(site, rel))
        if digest is None:
            return None
        entries.append((rel, digest))
    entries.append((entry + "/RECORD", comparable_record_hash(os.path.join(site, entry))))
    return tree_hash(entries)


def hashes(params):
    """sha256 of each RECORD path in `paths_z` (None when absent), packed."""
    info = interpreter()
    cache = HashCache(user_cache_dir(params.get("cache_dir") or "/var/lib/fleetctl/cache", "cache"), info["prefix"])
    out = {}
    for rel in unpack_json(params.get("paths_z")) or []:
        path = os.path.normpath(os.path.join(info["site"], rel))
        parts = rel.split("/")
        if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "RECORD":
            out[rel] = comparable_record_hash(os.path.dirname(path))  # by its rows, as the source's
        else:
            out[rel] = cached_hash(cache, path)
    cache.save()
    return {"hashes_z": pack_json(out)}


def cached_hash(cache, path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not S_ISREG(st.st_mode):  # the stat at hand, not a second one (once per file of the venv)
        return None
    hit = cache.lookup(path, st)
    if hit:
        return hit[0]
    digest = file_hash(path)[7:]
    cache.store(path, st, digest, None)
    return digest


def main(params):
    params = params or {}
    if params.get("action", "list") == "list":
        return listing(params)
    if params.get("action") == "hashes":
        return hashes(params)
    raise ValueError("unknown action %r" % params.get("action"))


class DirectError(Exception):
    """The source host could not be reached from here: nothing was written."""


class DirectSource(object):
    """The source's stream pulled over this host's own ssh: `argv` runs the source's stream
    command there; the bytes read() returns are the frames' payloads, as the controller would
    have forwarded them."""

    def __init__(self, direct):
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(direct["argv"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errors)
        self.buf, self.left, self.done = bytearray(), 0, False
        body = json.dumps(direct["params"]).encode("utf-8")
        try:
            self.proc.stdin.write(struct.pack(">I", len(body)) + body)
            self.proc.stdin.close()
        except (IOError, OSError):
            pass  # ssh already gone: the reason is on its stderr, read below

    def stderr(self):
        self.errors.seek(0)
        return self.errors.read().decode("utf-8", "replace")

    def why(self):
        """ssh's reason, one line: the line that says what failed, else its last line."""
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        lines = [line.strip().rstrip(".") for line in self.stderr().splitlines() if line.strip()]
        for key in ("Host key verification failed", "Permission denied", "Connection refused", "Could not resolve",
                    "timed out", "No route to host", "Identity file"):
            for line in lines:
                if key in line:
                    return line
        return lines[-1] if lines else "ssh exited with status %s" % self.proc.returncode

    def more(self):
        chunk = self.proc.stdout.read1(1 << 18)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def start(self):
        """Wait for the source's magic: until then ssh may still fail, and nothing is written."""
        while STREAM_MAGIC not in self.buf:
            if len(self.buf) > 1 << 16 or not self.more():
                raise DirectError(self.why())
        self.buf = self.buf[self.buf.index(STREAM_MAGIC) + len(STREAM_MAGIC):]

    def exact(self, n):
        while len(self.buf) < n:
            if not self.more():
                tail = self.stderr().strip()
                raise EOFError("the stream from the source ended early" + (" (%s)" % tail[-500:] if tail else ""))
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read(self, n):
        while self.left == 0:
            if self.done:
                return b""
            self.left = struct.unpack(">I", self.exact(4))[0]
            self.done = self.left == 0
        if not self.buf and not self.more():
            return self.exact(1)  # raises, with the source's reason
        out = bytes(self.buf[:min(n, self.left)])
        del self.buf[:len(out)]
        self.left -= len(out)
        return out

    def close(self):
        for handle in (self.proc.stdout, self.errors):
            handle.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class DiskFull(Exception):
    """The target venv's filesystem, or the state folder (journal, manifest), filled up."""


@contextlib.contextmanager
def state_full_said(applier, what, after, remove=None):
    """A full state folder while ``what`` is written: one line saying where, what, and what holds;
    ``remove`` (a file) goes first."""
    try:
        yield
    except (IOError, OSError) as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        if remove and os.path.lexists(remove):
            os.unlink(remove)
        raise DiskFull("no space left on device in %s (writing %s); %s"
                       % (os.path.dirname(applier.journal), what, after))


def apply(plan, read):
    """1. note temp names in a journal; 2. new files land (temp + rename) as the stream brings
    them; 3. old files the new RECORD no longer lists are removed; 4. old dist-info removed, new
    dist-info written, RECORD last; 5. manifest; 6. journal removed."""
    started = time.time()
    applier = Applier(plan)
    # Everything this run writes, checked before the journal (its first write) exists.
    require_writable([[applier.site, "the venv's site-packages", None],
                      [os.path.join(applier.prefix, "bin"), "the venv's scripts", None],
                      [os.path.dirname(applier.journal), "overlay journal and manifests", "fleetctl_state_dir"]])
    with state_full_said(applier, "the overlay journal", "nothing written to %s: run again when there is room"
                         % applier.prefix):
        applier.begin()
    source = Decompressor(read, int(plan.get("level", 1)) > 0)
    reader, received, name = TarReader(source), set(), None
    try:
        while True:
            member = reader.next_file()
            if member is None:
                break
            name = member[0]
            applier.land(*member, reader=reader)
            received.add(os.path.normpath(name))
        source.finish()
    except (IOError, OSError) as exc:
        applier.cache.save()  # what landed whole is known, whatever stopped the rest
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        applier.clear_leftovers()  # the journal stays: the next run knows this one did not finish
        raise DiskFull("no space left on device in %s (writing %s); temporary files removed, %d files written "
                       "(each whole), the old dist-info still in place: run again when there is room"
                       % (applier.prefix, name or "?", applier.written))
    applier.cache.save()
    missing = sorted(set(os.path.normpath(r) for r in plan["expect"]) - received)
    if missing:
        raise IOError("the stream lacked %d files, e.g. %s" % (len(missing), missing[0]))
    applier.remove_old_files()
    applier.replace_dist_info()
    # Every file has landed: the journal (temp names to clear) has done its work, and goes even when
    # the record cannot be written, so the next run does not take a finished overlay for a cut one.
    with state_full_said(applier, "the overlay manifest", "every file is in %s, each whole; only the record "
                         "`fleetctl drift` reads (manifest, origins) is missing" % applier.prefix, applier.journal):
        manifest = write_manifest(plan, applier)
    os.unlink(applier.journal)
    return {"written": applier.written, "removed": applier.removed, "bytes_in": source.bytes_in,
            "seconds": round(time.time() - started, 3), "manifest": manifest}


def stream_main():
    fd = sys.stdin.fileno()
    plan = serve_calls(fd, main)  # the listing calls first (overlay_calls), then the plan
    if plan is None:
        return  # listed only (nothing to change, a dry run): nothing asked, nothing to say
    direct = None
    try:
        if plan.get("direct"):
            direct = DirectSource(plan["direct"])
            direct.start()
            read = direct.read
        else:
            def read(n):
                return os.read(fd, n)
        answer = {"ok": True, "result": apply(plan, read)}
    except DirectError as exc:
        answer = {"ok": False, "error": "DirectError: %s" % exc, "unreachable": str(exc)}
    except NotPermitted as exc:  # refused before any change: the line as it is
        answer = {"ok": False, "error": str(exc), "not_permitted": True}
    except Exception as exc:
        answer = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    finally:
        if direct is not None:
            direct.close()
    sys.stdout.write("\n%s\n%s\n%s\n" % (BEGIN, json.dumps(answer), END))
    sys.stdout.flush()


if __name__ == "__main__":
    stream_main()
