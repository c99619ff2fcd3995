"""Unified diffs applied on the controller, exactly: no fuzz, no offset search.

A release carries patches, each made for one distribution at one version (say sglang 0.5.23).
The controller fetches the host's own copy of each target file once, applies the patch in memory
with :func:`apply` and later writes the results to the host, so the host needs no ``patch``,
``git`` or network. ``unidiff`` parses; application is done here, strictly: every context and
removed line of every hunk must equal the file's line at the position the hunk states, line
ending included, else :class:`PatchMismatch` names in one line the host, the file, the versions
and the first hunk that does not fit.

Paths in a patch are relative to the distribution's package root (``site-packages``), with the
usual ``a/`` and ``b/`` prefixes stripped: ``sglang/srt/speculative/spec_info.py``.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from unidiff import Hunk as _UnidiffHunk
from unidiff import PatchedFile
from unidiff import PatchSet as _UnidiffPatchSet
from unidiff.constants import DEV_NULL, SUBMODULE_FILE_MODE, SYMLINK_FILE_MODE
from unidiff.errors import UnidiffParseError

from fleetctl.errors import HostError, InputError

CONTEXT, REMOVED, ADDED = " ", "-", "+"
_NO_NEWLINE = "\\"


@dataclass(frozen=True)
class HunkLine:
    """One line of a hunk: ``kind`` is ' ', '-' or '+'; ``text`` is the line as it is in the file,
    with its ending (no '\\n' when the patch says "\\ No newline at end of file")."""

    kind: str
    text: str


@dataclass(frozen=True)
class Hunk:
    source_start: int
    source_length: int
    target_start: int
    target_length: int
    lines: list[HunkLine]
    diff_line: int  # line of the '@@' header in the patch file

    @property
    def header(self) -> str:
        return f"@@ -{self.source_start},{self.source_length} +{self.target_start},{self.target_length} @@"

    @property
    def first_index(self) -> int:
        """0-based index of the hunk's first source line (a pure insertion inserts before it)."""
        return self.source_start - 1 if self.source_length else self.source_start


@dataclass(frozen=True)
class FilePatch:
    path: str  # relative to the distribution's package root, e.g. sglang/srt/server_args.py
    new_file: bool
    deleted: bool
    hunks: list[Hunk]


@dataclass(frozen=True)
class PatchSet:
    source: str  # the patch file, as given
    files: list[FilePatch]

    @property
    def name(self) -> str:
        return posixpath.basename(self.source)

    def paths(self) -> list[str]:
        return [f.path for f in self.files]


class PatchMismatch(HostError):
    """A patch does not fit a host's file; one line names host, file, versions and the hunk."""

    def __init__(self, host: str, path: str, patch_file: str, versions: str, detail: str,
                 hunk: str | None = None, line: int | None = None) -> None:
        super().__init__(host, f"{path} does not match {patch_file}: {versions}; {detail}")
        self.path = path
        self.patch_file = patch_file
        self.detail = detail
        self.hunk = hunk
        self.line = line


def sha256_hex(text: str) -> str:
    """SHA-256 of ``text`` as UTF-8 (surrogate escapes turned back into the bytes they stand for)."""
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


# --------------------------------------------------------------------------- parsing


def load_patch(path: Path) -> PatchSet:
    """Parse a patch file; a malformed or unsafe patch raises InputError naming ``file:line``."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: a patch must be UTF-8 text") from None
    return parse_patch(text, str(path))


def parse_patch(text: str, source: str) -> PatchSet:
    """Parse unified-diff ``text``; ``source`` names it in error messages."""
    lines = _split_lines(text if text.endswith("\n") or not text else text + "\n")
    reader = _Reader(lines)
    try:
        parsed = _UnidiffPatchSet(reader)
    except UnidiffParseError as exc:
        in_hunk = str(exc).startswith("Hunk") and reader.hunk_line
        where = f" (in the hunk at line {reader.hunk_line})" if in_hunk else ""
        raise InputError(f"{source}:{reader.line_no}: malformed diff: {str(exc).strip()}{where}") from None
    if not parsed:
        raise InputError(f"{source}:1: no file diffs found (expected '--- a/PATH', '+++ b/PATH' and '@@' hunks)")
    files = [_file_patch(pf, source) for pf in parsed]
    seen: set[str] = set()
    for pf, fp in zip(parsed, files, strict=True):
        if fp.path in seen:
            raise InputError(f"{source}:{pf.diff_line_no}: {fp.path} appears twice; give one diff per file")
        seen.add(fp.path)
    return PatchSet(source, files)


class _Reader:
    """Feeds lines to unidiff and remembers where it is, so parse errors can name a line."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.line_no = 0
        self.hunk_line = 0

    def __iter__(self) -> Iterator[str]:
        for number, line in enumerate(self.lines, 1):
            self.line_no = number
            if line.startswith("@@"):
                self.hunk_line = number
            yield line


def _split_lines(text: str) -> list[str]:
    """Lines with their endings, split on '\\n' only (a '\\r' or form feed stays in its line)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _file_patch(pf: PatchedFile, source: str) -> FilePatch:
    line = pf.diff_line_no or 1
    if pf.is_binary_file:
        raise InputError(f"{source}:{line}: binary patch for {pf.path!r}: binary patches are not supported")
    modes = (pf.source_mode, pf.target_mode)
    if SYMLINK_FILE_MODE in modes or SUBMODULE_FILE_MODE in modes:
        raise InputError(f"{source}:{line}: {pf.path!r} is a symlink or submodule: only regular files are patched")
    new_file, deleted = pf.source_file == DEV_NULL, pf.target_file == DEV_NULL
    if new_file and deleted:
        raise InputError(f"{source}:{line}: both sides of the diff are {DEV_NULL}")
    if not new_file and not deleted and None not in modes and pf.source_mode != pf.target_mode:
        raise InputError(f"{source}:{line}: {pf.path!r}: file mode changes are not supported")
    old = None if new_file else _safe_path(pf.source_file, "a/", source, line)
    new = None if deleted else _safe_path(pf.target_file, "b/", source, line)
    if old is not None and new is not None and old != new:
        raise InputError(f"{source}:{line}: renames are not supported ({old} -> {new})")
    path = new or old
    assert path is not None
    hunks = [_hunk(h, source) for h in pf]
    _check_hunks(hunks, path, new_file, deleted, source, line)
    return FilePatch(path, new_file, deleted, hunks)


def _safe_path(raw: str, prefix: str, source: str, line: int) -> str:
    """``raw`` without its a/ or b/ prefix, refused unless it stays inside the package root."""
    raw = raw.removesuffix("\r")  # a CRLF patch file
    path = raw[len(prefix):] if raw.startswith(prefix) else raw
    problem = _path_problem(path)
    if problem:
        raise InputError(f"{source}:{line}: refused path {raw!r}: {problem} "
                         "(patch paths are relative to the distribution's package root)")
    return posixpath.normpath(path)


def _path_problem(path: str) -> str | None:
    if not path.strip():
        return "it is empty"
    if path.startswith('"'):
        return "quoted (escaped) path names are not supported"
    if path.startswith("/"):
        return "it is absolute"
    if "\\" in path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "it holds a backslash or a control character"
    if ".." in path.split("/"):
        return "it contains '..'"
    normal = posixpath.normpath(path)
    if normal in (".", "..") or normal.startswith(("../", "/")):
        return "it leaves the package root"
    return None


def _hunk(h: _UnidiffHunk, source: str) -> Hunk:
    lines: list[HunkLine] = []
    first = next((ln.diff_line_no for ln in h if ln.diff_line_no), None)
    header_line = first - 1 if first else 0
    for ln in h:
        if ln.line_type == _NO_NEWLINE:
            if not lines:
                raise InputError(f"{source}:{header_line}: '\\ No newline at end of file' follows no line")
            last = lines[-1]
            lines[-1] = HunkLine(last.kind, last.text.removesuffix("\n"))
        elif ln.line_type in (CONTEXT, REMOVED, ADDED):
            lines.append(HunkLine(ln.line_type, ln.value))
    return Hunk(h.source_start, h.source_length, h.target_start, h.target_length, lines, header_line)


def _check_hunks(hunks: list[Hunk], path: str, new_file: bool, deleted: bool, source: str, line: int) -> None:
    if not hunks and not (new_file or deleted):
        raise InputError(f"{source}:{line}: {path} has no hunks (mode changes and renames are not supported)")
    end = 0
    for hunk in hunks:
        if hunk.first_index < end:
            raise InputError(f"{source}:{hunk.diff_line}: {path}: hunk {hunk.header} overlaps or precedes the one "
                             "before it")
        end = hunk.first_index + hunk.source_length
        kinds = {ln.kind for ln in hunk.lines}
        if new_file and (kinds - {ADDED} or hunk.source_start or hunk.source_length):
            raise InputError(f"{source}:{hunk.diff_line}: {path} is a new file ({DEV_NULL}) but the hunk "
                             f"{hunk.header} keeps or removes lines")
        if deleted and (kinds - {REMOVED} or hunk.target_length):
            raise InputError(f"{source}:{hunk.diff_line}: {path} is deleted ({DEV_NULL}) but the hunk "
                             f"{hunk.header} keeps or adds lines")


# --------------------------------------------------------------------------- application


@dataclass(frozen=True)
class _Target:
    """What a mismatch message names."""

    host: str
    path: str
    patch_file: str
    versions: str

    def mismatch(self, detail: str, hunk: Hunk | None = None, line: int | None = None) -> PatchMismatch:
        return PatchMismatch(self.host, self.path, self.patch_file, self.versions, detail,
                             hunk.header if hunk else None, line)


def apply(patch: FilePatch, original: str | None, *, patch_file: str, host: str, dist: str,
          expected_version: str, found_version: str) -> str:
    """The host's file after ``patch``: every hunk must fit exactly where it says, else PatchMismatch.

    ``original`` is the host's file content, None when the file is absent. A new file needs an
    absent one; for a deleted file the whole content must match and "" is returned (the caller
    removes the file: ``patch.deleted``). Line endings are kept as they are.
    """
    versions = f"patch made for {dist} {expected_version}, host has {found_version}"
    target = _Target(host, patch.path, patch_file, versions)
    if patch.new_file and original is not None:
        raise target.mismatch("the patch creates this file but the host already has it")
    if not patch.new_file and original is None:
        raise target.mismatch("the host has no such file")
    lines = _split_lines(original or "")
    out = _apply_hunks(patch.hunks, lines, target)
    if patch.deleted and out:
        raise target.mismatch(f"the patch deletes the file but the host's copy has {len(out)} more line(s) "
                              f"(line {len(lines) - len(out) + 1}: {_show(out[0])})")
    return "".join(out)


def apply_patch_set(patch_set: PatchSet, files: Mapping[str, str | None], *, host: str, dist: str,
                    expected_version: str, found_version: str) -> dict[str, str | None]:
    """Apply every file of ``patch_set``; ``files`` maps each of its paths to the host's content
    (None: absent). Returns path -> new content (None: deleted). Chain these through a series."""
    missing = [p for p in patch_set.paths() if p not in files]
    if missing:
        raise ValueError(f"{patch_set.name}: no content given for {', '.join(missing)}")
    result: dict[str, str | None] = {}
    for fp in patch_set.files:
        text = apply(fp, files[fp.path], patch_file=patch_set.name, host=host, dist=dist,
                     expected_version=expected_version, found_version=found_version)
        result[fp.path] = None if fp.deleted else text
    return result


def _apply_hunks(hunks: list[Hunk], lines: list[str], target: _Target) -> list[str]:
    out: list[str] = []
    pos = 0
    for hunk in hunks:
        start = hunk.first_index
        if start > len(lines):
            raise target.mismatch(f"first hunk that does not fit: {hunk.header} (the file has only "
                                  f"{len(lines)} lines)", hunk, start)
        out.extend(lines[pos:start])
        pos = _apply_hunk(hunk, lines, start, out, target)
    out.extend(lines[pos:])
    return out


def _apply_hunk(hunk: Hunk, lines: list[str], start: int, out: list[str], target: _Target) -> int:
    """Check one hunk against ``lines`` from ``start``, append its result to ``out``; returns the
    index of the first line after it."""
    index = start
    for ln in hunk.lines:
        if ln.kind == ADDED:
            out.append(ln.text)
            continue
        found = lines[index] if index < len(lines) else None
        if found != ln.text:
            raise target.mismatch(f"first hunk that does not fit: {hunk.header} (line {index + 1}: "
                                  f"{_difference(ln.text, found)})", hunk, index + 1)
        if ln.kind == CONTEXT:
            out.append(found)
        index += 1
    return index


def _difference(expected: str, found: str | None) -> str:
    if found is None:
        return f"expected {_show(expected)}, found the end of the file"
    if expected.removesuffix("\n") == found.removesuffix("\n"):
        return f"expected {_show(expected, True)}, found {_show(found, True)}"
    return f"expected {_show(expected)}, found {_show(found)}"


def _show(line: str, ending: bool = False) -> str:
    """A line for a one-line message: quoted, without its '\\n' (named when ``ending``)."""
    text = repr(line.removesuffix("\n"))
    if ending:
        text += " and a newline" if line.endswith("\n") else " without a newline at the end of the file"
    return text
