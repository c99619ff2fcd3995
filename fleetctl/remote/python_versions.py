# fleetctl-include: writable
# Included by facts.py (`# fleetctl-include: python_versions`): each interpreter's version, asked once
# per binary. Starting a Python to ask is ~15 ms of a host's CPU per interpreter on every `facts`; an
# unchanged binary gives the same answer, so the answer is remembered under the binary's identity:
# (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) of its real path, and of every libpython the
# interpreter had mapped when it answered (a dynamically linked python's version lives there). Any of
# them replaced or rewritten (a new inode or ctime: no one sets ctime by hand) and it is asked again.
# Only ELF binaries are remembered: a script (a pyenv shim) answers from files we cannot see.
# Remembered by a kept agent (AGENT_MEMO), and across runs in one file private to this user (0600 in
# a 0700 folder, replaced atomically, see writable.py); a file not trusted or damaged is ignored.
# Stdlib only, Python >= 3.8.
import os

PYTHON_NAME = r"^python3(\.\d+)?$"
PYTHON_DIRS = ("/usr/bin", "/usr/local/bin")
PYTHONS_CACHE_SCHEMA = "fleetctl-python-versions/1"
PYTHON_TIMEOUT_S = 5.0
# A file changed in the last seconds is not remembered: a file system's timestamps are coarse (a
# clock tick), and a second change in the same tick would leave the same identity.
SETTLE_S = 2.0
# The version, then every libpython this process has mapped (Linux: /proc/self/maps), one a line.
VERSION_SNIPPET = (
    "import sys\n"
    "print('.'.join(map(str, sys.version_info[:3])))\n"
    "try:\n"
    "    f = open('/proc/self/maps')\n"
    "    libs = set(l.split(None, 5)[5].strip() for l in f if 'libpython' in l and len(l.split(None, 5)) > 5)\n"
    "except (OSError, IndexError):\n"
    "    libs = set()\n"
    "for lib in sorted(libs):\n"
    "    print(lib)\n"
)


def find_pythons(cache_dir=None):
    """python3 / python3.X on PATH and in the usual bin folders, each binary asked for its version
    once while it is unchanged (PythonVersions)."""
    dirs = []
    for d in os.environ.get("PATH", "").split(os.pathsep) + list(PYTHON_DIRS):
        if d and d not in dirs:
            dirs.append(d)
    paths = []
    for d in dirs:
        for name in python_names(d):
            path = os.path.join(d, name)
            if os.access(path, os.X_OK) and not os.path.isdir(path):
                paths.append((path, os.path.realpath(path)))
    # python3 and python3.11 are often one binary: ask each real file once; those not remembered in
    # parallel, since wrappers such as pyenv shims take a few hundred ms each.
    reals = sorted(set(real for _, real in paths))
    store = PythonVersions(user_cache_dir(cache_dir, "cache") if cache_dir else None)  # noqa: F821 (writable)
    versions = dict((real, (store.known(real), None)) for real in reals)
    unknown = [real for real in reals if versions[real][0] is None]
    if len(unknown) > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=8) as pool:
            versions.update(zip(unknown, pool.map(store.ask, unknown)))
    elif unknown:
        versions[unknown[0]] = store.ask(unknown[0])
    store.save()
    found = []
    for path, real in paths:
        version, error = versions[real]
        found.append({"path": path, "realpath": real, "version": version, "error": error})
    return found


def python_names(folder):
    """The python3 / python3.X names in ``folder``, sorted. A kept agent remembers them while the
    folder's identity holds (adding, removing or renaming an entry changes its mtime and ctime):
    listing /usr/bin is most of what `facts` costs a host once the versions are remembered."""
    import re
    try:
        st = os.stat(folder)
    except OSError:
        return []
    memo, key = globals().get("AGENT_MEMO"), ("python_names", folder)
    identity = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    if memo is not None and key in memo and memo[key][0] == identity:
        return memo[key][1]
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = sorted(n for n in names if n.startswith("python3") and re.match(PYTHON_NAME, n))  # cheap test first
    if memo is not None and settled(identity):
        memo[key] = (identity, found)
    return found


def binary_identity(path):
    """[dev, inode, size, mtime_ns, ctime_ns] of ``path`` (followed), None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def settled(identity):
    """Whether the file of ``identity`` last changed (its ctime) more than SETTLE_S ago."""
    import time

    return identity is not None and time.time() - identity[4] / 1e9 > SETTLE_S


def is_elf(path):
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


def still_valid(real, entry):
    """Whether ``entry`` ([identity, version, [[lib, identity], ...]]) still describes ``real``."""
    if type(entry) is not list or len(entry) != 3 or type(entry[1]) is not str or type(entry[2]) is not list:
        return False
    if entry[0] is None or entry[0] != binary_identity(real):
        return False
    for lib in entry[2]:
        if type(lib) is not list or len(lib) != 2 or type(lib[0]) is not str or lib[1] != binary_identity(lib[0]):
            return False
    return True


class PythonVersions(object):
    """real path -> (version, error), each real path asked at most once while its binary is unchanged."""

    def __init__(self, cache_dir):
        self.memo = globals().get("AGENT_MEMO")  # set by a kept agent; None in a child
        self.path = os.path.join(cache_dir, "python-versions.marshal") if cache_dir else None
        self.file = None  # the file's entries, read when the memo does not answer
        self.learnt = {}

    def known(self, real):
        key = ("python_version", real)
        if self.memo is not None and still_valid(real, self.memo.get(key)):
            return self.memo[key][1]
        if self.file is None:
            self.file = self.load()
        entry = self.file.get(real)
        if still_valid(real, entry):
            if self.memo is not None:
                self.memo[key] = entry
            return entry[1]
        return None

    def load(self):
        import marshal

        data, _distrust = read_private(self.path) if self.path else (None, None)  # noqa: F821 (writable)
        try:
            doc = marshal.loads(data) if data else None
        except (EOFError, ValueError, TypeError):
            doc = None
        if type(doc) is not dict or doc.get("schema") != PYTHONS_CACHE_SCHEMA or type(doc.get("entries")) is not dict:
            return {}
        return doc["entries"]

    def ask(self, real):
        """(version, error) of ``real``: remembered, or asked now (and remembered when it answered)."""
        version = self.known(real)
        if version is not None:
            return version, None
        identity = binary_identity(real)
        version, libs, error = run_version(real)
        libs = [[lib, binary_identity(lib)] for lib in libs]
        if (version is not None and settled(identity) and identity == binary_identity(real) and is_elf(real)
                and all(settled(lib[1]) for lib in libs)):
            entry = [identity, version, libs]
            self.learnt[real] = entry
            if self.memo is not None:
                self.memo[("python_version", real)] = entry
        return version, error

    def save(self):
        if not self.learnt or not self.path:
            return
        import marshal

        entries = dict(self.file or {})
        entries.update(self.learnt)
        entries = dict((real, entries[real]) for real in sorted(entries)[-256:])  # bounded
        write_private(self.path, marshal.dumps({"schema": PYTHONS_CACHE_SCHEMA, "entries": entries}, 2))  # noqa: F821


def run_version(path):
    """(version, libpython paths, error) from running ``path``."""
    import subprocess
    try:
        proc = subprocess.run(
            [path, "-c", VERSION_SNIPPET], capture_output=True, timeout=PYTHON_TIMEOUT_S, text=True,
        )
    except subprocess.TimeoutExpired:
        return None, [], "timed out after %gs" % PYTHON_TIMEOUT_S
    except OSError as exc:
        return None, [], str(exc)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        first = lines[0][:300] if lines else ""  # e.g. "pyenv: python3.10: command not found"
        return None, [], "exited %d: %s" % (proc.returncode, first)
    lines = proc.stdout.strip().splitlines()
    if not lines:
        return None, [], None
    return lines[0].strip() or None, [line for line in lines[1:] if line.startswith("/")], None
