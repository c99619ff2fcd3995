# fleetctl-include: source_fanout
# fleetctl-include: source_symbol
# fleetctl-include: grep_cache
# fleetctl-include: grep_guards
"""Search the source of a package installed for this interpreter: grep and symbol.

Stdlib only, Python >= 3.8. Run under a venv's python (the agent starts it as a child) so that the
package is found where ``import`` would find it: ``importlib.util.find_spec`` (which does not
execute the package), never a hard-coded path. Paths in answers are relative to the folder that
holds the package (site-packages), so they read ``sglang/srt/...`` like pip's RECORD.

params:
  mode:        "grep" | "symbol"
  package:     import name, e.g. "sglang" ("sglang.srt" works too, nothing is imported)
  subpath:     optional folder or file under the package, e.g. "srt"
  grep:        terms (list of str), regex (bool), ignore_case (bool), max_hits (int), context (int),
               cache_dir (str: where what this search learnt is kept for the next one with the same
               terms, grep_cache.py; a user who cannot write it keeps its own in ~/.cache/fleetctl;
               without it every file is read and nothing is kept)
  symbol:      name ("update_mamba_state_after_mtp_verify" or "SpeculativeAlgorithm.DFLASH")

Speed matters (2,141 files in sglang/srt): each file is read once as bytes; fixed strings are
found with ``bytes.find`` on the whole file, line numbers are counted only around hits, and only
matching lines are decoded. No per-line Python loop. The files are shared out, in chunks taken
from a queue, among forked workers, one per usable CPU (``workers`` in params overrides). The
interpreter's start counts as much as the search: a grep imports nothing beyond what every
Python starts with (re, ast and importlib.util only where they are needed).
"""

import os
import sys
import time

BINARY_PROBE = 8192  # a NUL byte in the first 8 KB marks a binary file, as ripgrep does
FIRST_READ = 1 << 16
MAX_LINE = 500  # longer matching lines (minified files) are cut, the count is unaffected
PY_SUFFIXES = (".py", ".pyi")
UNREADABLE = False  # what read_text_bytes gives for a file it may not open or read
EXIT_AT_ONCE = True  # the agent's child runner may end the process right after the answer: nothing to tidy up
ast = None  # the ast module, imported by load_ast() for symbol searches only: grep does without it


class ProbeInputError(Exception):
    """The request cannot be answered on this host (no such package, path or regex)."""


def main(params):
    params = params or {}
    mode = params.get("mode")
    if mode == "grep":
        return grep(params)
    if mode == "symbol":
        return symbol(params)
    raise ProbeInputError("unknown mode %r (expected grep or symbol)" % (mode,))


# -- locating the package --------------------------------------------------------------------

def python_version():
    return "%d.%d.%d" % tuple(sys.version_info[:3])


def interpreter():
    return "%s (Python %s)" % (sys.executable, python_version())


def find_spec(top):
    """importlib.util.find_spec(top) for a top-level name without importing importlib.util (its
    imports are ~3 ms of a child's start): the import system's own _find_spec(name, None), which
    importlib.util.find_spec calls for a name not imported yet (Python 3.4 to 3.13); that
    function itself where it is missing or the name is imported already."""
    finder = getattr(sys.modules.get("_frozen_importlib"), "_find_spec", None)
    if finder is None or top in sys.modules:
        import importlib.util
        return importlib.util.find_spec(top)
    return finder(top, None)


def find_package(package):
    """(root, package_dir): root is the folder holding the package, answers' paths start there."""
    top, _, rest = package.partition(".")
    saved = sys.path[:]
    # A '' or '.' entry (python -c) would let the current directory shadow the installed package.
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    try:
        spec = find_spec(top)
    except (ImportError, ValueError) as exc:
        raise ProbeInputError("cannot look up %s for %s: %s" % (top, interpreter(), exc)) from None
    finally:
        sys.path[:] = saved
    if spec is None:
        raise ProbeInputError("%s is not installed for %s" % (top, interpreter()))
    locations = list(spec.submodule_search_locations or [])
    if locations:
        pkg_dir = os.path.join(locations[0], *rest.split(".")) if rest else locations[0]
        if not os.path.isdir(pkg_dir):
            raise ProbeInputError("%s has no subpackage folder %s (%s)" % (top, rest, interpreter()))
        return os.path.dirname(locations[0]), pkg_dir
    if spec.origin and os.path.isfile(spec.origin) and not rest:  # a single-module distribution
        return os.path.dirname(spec.origin), spec.origin
    raise ProbeInputError("%s has no source files for %s (built-in or frozen)" % (package, interpreter()))


def search_base(params):
    """(root, package_dir, base): base is the folder or file searched."""
    package = params.get("package") or ""
    if not package or package.startswith(".") or "/" in package:
        raise ProbeInputError("bad package name %r" % (package,))
    root, pkg_dir = find_package(package)
    subpath = (params.get("subpath") or "").strip("/")
    if not subpath:
        return root, pkg_dir, pkg_dir
    parts = subpath.split("/")
    if ".." in parts or os.path.isabs(subpath):
        raise ProbeInputError("subpath %r must stay inside the package folder" % (subpath,))
    base = os.path.join(pkg_dir, *parts)
    if not os.path.exists(base):
        raise ProbeInputError("subpath %s not found in %s" % (subpath, pkg_dir))
    return root, pkg_dir, base


def list_files(base, suffixes=None):
    """Every regular file under base, skipping __pycache__; symlinks are not followed (as rg)."""
    if os.path.isfile(base):
        return [base]
    out = []
    stack = [base]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    if suffixes is None or entry.name.endswith(suffixes):
                        out.append(entry.path)
    return out


def read_text_bytes(path, stats=None):
    """The file's bytes; None for a binary file (only its first 64 KB are read then); UNREADABLE.
    ``stats``: a list the opened file's fstat is put in, before it is read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return UNREADABLE
    try:
        if stats is not None:
            stats.append(os.fstat(fd))
        head = os.read(fd, FIRST_READ)  # most source files fit: one read
        if head.find(b"\0", 0, BINARY_PROBE) >= 0:
            return None
        if len(head) < FIRST_READ:
            return head
        chunks = [head]
        while True:
            more = os.read(fd, 1 << 20)
            if not more:
                return b"".join(chunks)
            chunks.append(more)
    except OSError:
        return UNREADABLE
    finally:
        os.close(fd)


def answer_base(root, pkg_dir, base):
    return {"schema": 1, "python": sys.executable, "python_version": python_version(),
            "root": root, "package_dir": pkg_dir, "search_path": base}


# -- grep ------------------------------------------------------------------------------------

def compile_terms(terms, regex, ignore_case):
    """(finders, hay_kind): finders[i](hay, pos) -> offset of the next match of term i, or -1.

    hay_kind says what the finders search: "bytes", "lower" (ASCII-lowered bytes, for -i), or
    "text" (decoded str, only when a term is non-ASCII: bytes cannot fold its case).
    """
    if not terms or any(not t for t in terms):
        raise ProbeInputError("empty search term")
    text = any(ord(c) > 127 for t in terms for c in t)
    if not regex and not text:
        if ignore_case:
            return [_fixed(t.lower().encode("ascii")) for t in terms], "lower"
        return [_fixed(t.encode("ascii")) for t in terms], "bytes"
    import re  # here only: fixed ASCII strings (the common case) do without its import

    flags = re.MULTILINE | (re.IGNORECASE if ignore_case else 0)
    finders = []
    for term in terms:
        source = term if regex else re.escape(term)
        try:
            pattern = re.compile(source if text else source.encode("utf-8"), flags)
        except re.error as exc:
            raise ProbeInputError("invalid regex %r: %s" % (term, exc)) from None
        finders.append(_searcher(pattern, "\n" if text else b"\n"))
    return finders, "text" if text else "bytes"


def _fixed(needle):
    return lambda hay, pos: hay.find(needle, pos)


def _searcher(pattern, nl):
    """Regexes match within one line, as grep: a whole-file match that crosses a line end (``\\s*``
    eats newlines) is checked again on each line it touched, each bounded to that line."""
    def find(hay, pos):
        while True:
            m = pattern.search(hay, pos)
            if m is None:
                return -1
            start, end = m.span()
            if hay.find(nl, start, end) < 0:
                return start
            line_start = hay.rfind(nl, 0, start) + 1
            while line_start <= end:
                line_end = hay.find(nl, line_start)
                line_end = len(hay) if line_end < 0 else line_end
                inner = pattern.search(hay, line_start, line_end)
                if inner is not None:
                    return inner.start()
                line_start = line_end + 1
            pos = line_start
    return find


def match_lines(hay, find, nl, pos):
    """{line number: offset of its first byte} of every line where ``find`` matches, from the first match at pos."""
    out = {}
    line, last = 1, 0
    while pos >= 0:
        line += hay.count(nl, last, pos)
        out[line] = hay.rfind(nl, 0, pos) + 1
        end = hay.find(nl, pos)
        if end < 0:
            break
        line, last = line + 1, end + 1
        pos = find(hay, last)
    return out


def line_text(src, start, nl):
    end = src.find(nl, start)
    piece = src[start:] if end < 0 else src[start:end]
    text = piece if isinstance(piece, str) else piece.decode("utf-8", "replace")
    text = text.rstrip("\r")
    return text if len(text) <= MAX_LINE else text[:MAX_LINE] + "\u2026"


def context_lines(src, start, lineno, n, nl):
    """[(line, text)] of the n lines before and after the line starting at ``start``."""
    out = []
    pos = start
    for i in range(1, n + 1):  # before: walk back one newline at a time
        if pos == 0:
            break
        pos = src.rfind(nl, 0, pos - 1) + 1
        out.append((lineno - i, line_text(src, pos, nl)))
    pos = start
    for i in range(1, n + 1):
        end = src.find(nl, pos)
        if end < 0 or end + 1 >= len(src):
            break
        pos = end + 1
        out.append((lineno + i, line_text(src, pos, nl)))
    return out


def grep_file(data, terms, finders, kind, budget, context, firsts=None):
    """One file's entry, or None without a match. ``budget``: how many lines may still be listed;
    ``firsts``: where each term first matches (-1: nowhere) when that is known already."""
    hay = data.lower() if kind == "lower" else data.decode("utf-8", "replace") if kind == "text" else data
    src = hay if kind == "text" else data
    nl = "\n" if kind == "text" else b"\n"
    per_term = {}
    for i, (term, find) in enumerate(zip(terms, finders)):
        first = find(hay, 0) if firsts is None else firsts[i]  # mostly no term: one C-level scan each
        if first >= 0:
            per_term[term] = match_lines(hay, find, nl, first)
    if not per_term:
        return None
    starts = {}
    for found in per_term.values():
        starts.update(found)
    entry = {"counts": {t: len(v) for t, v in per_term.items()}, "lines": len(starts), "hits": []}
    shown = sorted(starts)[:max(budget, 0)]
    for line in shown:
        entry["hits"].append({"line": line, "text": line_text(src, starts[line], nl),
                              "terms": [t for t in terms if line in per_term.get(t, ())]})
    around = {}
    for line in shown if context else ():
        around.update(context_lines(src, starts[line], line, context, nl))
    entry["context"] = sorted([n, t] for n, t in around.items() if n not in starts)
    return entry


def grep_files(paths, root, terms, finders, kind, max_hits, context, cache=None, guarded=(None, None)):
    """(entries, binary files, unreadable files, files answered by the cache, what the cache learnt)
    of some files, in the order given; at most max_hits lines listed. ``cache``: a GrepCache whose
    keys are paths relative to ``root`` (or None): a file whose stat shows the very file an earlier
    search read is answered from it, unread (see reusable). ``guarded``: fixed_needles' answer."""
    needles, groups = guarded
    entries, binary, unreadable, shown, cached, learnt = [], 0, 0, 0, 0, {}
    cut = len(root.rstrip("/")) + 1
    for path in paths:
        rel, st, stats = path[cut:], None, None
        if cache is not None and not cache.entries:  # nothing kept: the file's identity comes with its read
            stats = []
        elif cache is not None:
            st, known = cache.look(path, rel)  # before the read: a change after it moves ctime past the kept one
            if known is not None and (type(known) is not dict or reusable(known, max_hits - shown)):
                cached += 1
                if type(known) is dict:
                    known = dict(known)  # trim_hits changes it; the cache's own stays whole
                    trim_hits([known], max_hits - shown, context)
                    shown += len(known["hits"])
                    entries.append(known)
                else:
                    binary += known == BINARY
                continue
        data = read_text_bytes(path, stats)
        st = stats[0] if stats else st
        if data is None or data is UNREADABLE:
            binary += data is None
            unreadable += data is UNREADABLE
            if data is None and st is not None:
                cache.learn(learnt, rel, st, BINARY)
            continue
        firsts = None
        entry = None
        if needles is not None:  # most files hold no term: skip them without more ado (grep_guards.py)
            firsts = first_matches(data.lower() if kind == "lower" else data, needles, groups)
        elif kind == "bytes":
            firsts = [find(data, 0) for find in finders]
        if firsts is None or max(firsts) >= 0:
            entry = grep_file(data, terms, finders, kind, max_hits - shown, context, firsts)
        if entry is not None:
            entry["path"] = rel
            shown += len(entry["hits"])
            entries.append(entry)
        if st is not None:
            cache.learn(learnt, rel, st, NO_MATCH if entry is None else MATCH, entry)
    return entries, binary, unreadable, cached, learnt


def trim_hits(files, budget, context):
    """Keep the first ``budget`` listed lines by path; the counts are left whole."""
    for entry in files:
        if len(entry["hits"]) > budget:
            entry["hits"] = entry["hits"][:max(budget, 0)]
            kept = [h["line"] for h in entry["hits"]]
            entry["context"] = [c for c in entry["context"] if any(abs(c[0] - k) <= context for k in kept)]
        budget -= len(entry["hits"])


def grep(params):
    started = time.perf_counter()
    terms = list(params.get("terms") or [])
    regex, ignore_case = bool(params.get("regex")), bool(params.get("ignore_case"))
    finders, kind = compile_terms(terms, regex, ignore_case)
    guarded = fixed_needles(terms, regex, kind)
    root, pkg_dir, base = search_base(params)
    max_hits = max(int(params.get("max_hits", 200)), 0)
    context = max(int(params.get("context") or 0), 0)
    paths = sorted(list_files(base))  # sorted first, so the listed hits are the first ones by path
    cache = None
    if params.get("cache_dir"):
        key = (root, base, terms, regex, ignore_case, context)
        cache = GrepCache(user_cache_dir(params["cache_dir"], "cache"), key)

    budget = [max_hits]  # lines this process may still list: its chunks of paths come in order

    def work(part):
        found = grep_files(part, root, terms, finders, kind, budget[0], context, cache, guarded)
        budget[0] -= sum(len(e["hits"]) for e in found[0])
        return found

    workers = fan_out_width(paths, worker_count(params, len(paths)))
    parts = fan_out(work, paths, workers)
    files = sorted([e for p in parts for e in p[0]], key=lambda e: e["path"])
    trim_hits(files, max_hits, context)
    binary, unreadable = sum(p[1] for p in parts), sum(p[2] for p in parts)
    counts = dict((t, sum(e["counts"].get(t, 0) for e in files)) for t in terms)
    matched = sum(e["lines"] for e in files)
    shown = sum(len(e["hits"]) for e in files)
    answer = answer_base(root, pkg_dir, base)
    answer.update({
        "searched_files": len(paths) - binary - unreadable, "binary_files": binary,
        "unreadable_files": unreadable, "files": files, "counts": counts,
        "matched_lines": matched, "shown": shown, "truncated": shown < matched, "workers": workers,
        "cached_files": sum(p[3] for p in parts), "cache": cache_note(cache, root, paths, parts),
        "elapsed_ms": round((time.perf_counter() - started) * 1000, 1),
    })
    return answer
