"""Playbook modules ``file`` (a path's kind, mode, owner), ``lineinfile`` (one line of a text file)
and ``fetch`` (a host file brought to the controller), with Ansible's arguments and results.

``lineinfile`` decides on the controller (pure: ``edit_lines``) from the file's text and writes
through ``copy``'s path (atomic, refused when the file changed meanwhile); ``file`` and ``fetch``
call ``remote/file_ops.py``. Check mode changes nothing and says what would change.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from fleetctl.errors import HostError, InputError
from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module
from fleetctl.playbook.modules.files import MAX_CONTENT, MAX_DIFF_TEXT, _call, ensure_file, remote_call


def _absolute(value: str) -> str:
    if not value.startswith("/") or "\0" in value:
        raise ValueError(f"path {value!r}: expected an absolute path on the host")
    return value


def _octal(value: Any) -> Any:
    from fleetctl.playbook.modules.files import parse_mode

    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError(f"mode {value}: quote it, as an octal string such as \"0644\"")
    if isinstance(value, str):
        parse_mode(value)
    return value


def _ops(mc: ModuleContext, params: dict[str, Any]) -> Any:
    return remote_call(mc, "file_ops", "FileOpsError", params)


class FileStateArgs(Args):
    path: str = Field(validation_alias=AliasChoices("path", "dest", "name"))
    state: Literal["file", "directory", "absent", "touch", "link"] | None = None
    mode: str | None = None
    owner: str | None = None
    group: str | None = None
    src: str | None = None  # state: link: what the link points to
    recurse: bool = False

    _path = field_validator("path")(_absolute)
    _mode = field_validator("mode", mode="before")(_octal)

    @field_validator("owner", "group", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


@module("file", FileStateArgs)
def file(mc: ModuleContext, args: FileStateArgs) -> TaskResult:
    """A folder (``state: directory``, with its parents), an empty file (``touch``), a link, a path
    gone (``absent``), or an existing path's ``mode``/``owner``/``group`` (``recurse`` in a folder)."""
    from fleetctl.playbook.modules.files import parse_mode

    answer = _ops(mc, {"action": "file", "path": args.path, "state": args.state, "owner": args.owner,
                       "group": args.group, "src": args.src, "recurse": args.recurse, "check": mc.check,
                       "mode": parse_mode(args.mode) if args.mode else None})
    done = answer["actions"]
    verb = "would change" if mc.check else "changed"
    msg = f"{args.path}: {verb} ({', '.join(done[:4])})" if done else f"{args.path}: {answer['state']}, unchanged"
    return TaskResult(changed=bool(answer["changed"]), msg=msg, data={"path": args.path, "state": answer["state"]})


class LineInFileArgs(Args):
    path: str = Field(validation_alias=AliasChoices("path", "dest", "destfile", "name"))
    line: str | None = Field(default=None, validation_alias=AliasChoices("line", "value"))
    regexp: str | None = Field(default=None, validation_alias=AliasChoices("regexp", "regex"))
    search_string: str | None = None
    state: Literal["present", "absent"] = "present"
    insertafter: str | None = None  # "EOF" or a regex
    insertbefore: str | None = None  # "BOF" or a regex
    create: bool = False
    backrefs: bool = False
    firstmatch: bool = False
    mode: str | None = None

    _path = field_validator("path")(_absolute)
    _mode = field_validator("mode", mode="before")(_octal)

    @model_validator(mode="after")
    def _consistent(self) -> LineInFileArgs:
        if self.state == "present" and self.line is None:
            raise ValueError("lineinfile: state present needs line")
        if self.state == "absent" and self.line is None and self.regexp is None and self.search_string is None:
            raise ValueError("lineinfile: state absent needs line, regexp or search_string")
        if self.insertafter is not None and self.insertbefore is not None:
            raise ValueError("lineinfile: insertafter and insertbefore are exclusive")
        if self.regexp is not None and self.search_string is not None:
            raise ValueError("lineinfile: regexp and search_string are exclusive")
        for pattern in (self.regexp, self.insertafter, self.insertbefore):
            if pattern is not None and pattern not in ("EOF", "BOF"):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"lineinfile: bad regular expression {pattern!r}: {exc}") from None
        return self


@dataclass
class LineEdit:
    text: str
    msg: str  # "" when nothing changes

    @property
    def changed(self) -> bool:
        return bool(self.msg)


def _matches(args: LineInFileArgs, line: str) -> bool:
    if args.regexp is not None:
        return re.search(args.regexp, line) is not None
    if args.search_string is not None:
        return args.search_string in line
    return line == args.line


def edit_lines(text: str, args: LineInFileArgs) -> LineEdit:
    """Ansible's lineinfile on ``text`` (pure): the new text and what changed."""
    lines = text.splitlines()
    if args.state == "absent":
        kept = [line for line in lines if not _matches(args, line)]
        if len(kept) == len(lines):
            return LineEdit(text, "")
        return LineEdit(_joined(kept), f"{len(lines) - len(kept)} line(s) removed")
    assert args.line is not None
    found = [n for n, line in enumerate(lines) if _matches(args, line)] if (args.regexp or args.search_string) \
        else []
    if found:
        n = found[0] if args.firstmatch else found[-1]
        new = args.line
        if args.backrefs and args.regexp is not None:
            match = re.search(args.regexp, lines[n])
            assert match is not None
            new = match.expand(args.line)
        if lines[n] == new:
            return LineEdit(text, "")
        lines[n] = new
        return LineEdit(_joined(lines), "line replaced")
    if args.backrefs:  # Ansible: no match with backrefs changes nothing
        return LineEdit(text, "")
    if args.line in lines:
        return LineEdit(text, "")
    at = _insert_at(lines, args)
    lines.insert(at, args.line)
    return LineEdit(_joined(lines), "line added")


def _insert_at(lines: list[str], args: LineInFileArgs) -> int:
    if args.insertbefore == "BOF":
        return 0
    pattern = args.insertbefore or (args.insertafter if args.insertafter != "EOF" else None)
    if pattern is None:
        return len(lines)
    hits = [n for n, line in enumerate(lines) if re.search(pattern, line)]
    if not hits:
        return len(lines)
    n = hits[0] if args.firstmatch else hits[-1]
    return n if args.insertbefore else n + 1


def _joined(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


@module("lineinfile", LineInFileArgs)
def lineinfile(mc: ModuleContext, args: LineInFileArgs) -> TaskResult:
    """Make sure one line is in a text file (or replace the line ``regexp`` matches), or is not."""
    now = _call(mc, {"action": "stat", "path": args.path, "max_text": MAX_DIFF_TEXT})
    if not now["exists"]:
        if not args.create or args.state == "absent":
            if args.state == "absent":
                return TaskResult(msg=f"{args.path} does not exist")
            raise HostError(mc.host, f"{args.path} does not exist (create: true makes it)")
        text = ""
    elif now.get("kind") != "file":
        raise HostError(mc.host, f"{args.path} is a {now.get('kind')}, not a file")
    elif now.get("text") is None:
        raise HostError(mc.host, f"{args.path}: not a text file of at most {MAX_DIFF_TEXT} bytes")
    else:
        text = now["text"]
    edit = edit_lines(text, args)
    if not edit.changed and now["exists"] and args.mode is None:
        return TaskResult(msg=f"{args.path} unchanged", data={"path": args.path})
    result = ensure_file(mc, args.path, edit.text.encode("utf-8"), _mode_bits(args.mode))
    result.msg = f"{args.path}: {edit.msg}" if edit.changed else result.msg
    return result


def _mode_bits(mode: str | None) -> int | None:
    from fleetctl.playbook.modules.files import parse_mode

    return None if mode is None else parse_mode(mode)


class FetchArgs(Args):
    src: str
    dest: str
    flat: bool = False
    fail_on_missing: bool = True
    validate_checksum: bool = True  # always checked (sha256 of what arrived)

    _src = field_validator("src")(_absolute)


def fetch_dest(mc: ModuleContext, args: FetchArgs) -> Path:
    """Ansible's layout: ``dest/HOST/SRC`` (the host's name, then the whole source path), or with
    ``flat`` the file ``dest`` itself (``dest/`` + the source's name when it ends in ``/``)."""
    base = Path(args.dest) if os.path.isabs(args.dest) else mc.base_dir / args.dest
    if args.flat:
        return base / os.path.basename(args.src) if args.dest.endswith("/") else base
    return base / mc.host / args.src.lstrip("/")


@module("fetch", FetchArgs)
def fetch(mc: ModuleContext, args: FetchArgs) -> TaskResult:
    """Copy a host file to the controller (``dest``, relative to the playbook); changed when the
    controller's copy was missing or different."""
    answer = _ops(mc, {"action": "read", "path": args.src, "max_bytes": MAX_CONTENT})
    if not answer["exists"]:
        if args.fail_on_missing:
            return TaskResult(failed=True, msg=f"{args.src}: the remote file does not exist")
        return TaskResult(msg=f"{args.src} does not exist: nothing fetched")
    if answer["kind"] != "file":
        return TaskResult(failed=True, msg=f"{args.src} is a {answer['kind']}, not a file")
    if answer["data_b64"] is None:
        raise InputError(f"fetch {args.src}: {answer['size']} bytes; fetch takes at most {MAX_CONTENT}")
    data = base64.b64decode(answer["data_b64"])
    digest = hashlib.sha256(data).hexdigest()
    if digest != answer["sha256"]:
        return TaskResult(failed=True, msg=f"{args.src}: checksum mismatch after transfer")
    dest = fetch_dest(mc, args)
    same = dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == digest
    data_out = {"dest": str(dest), "checksum": digest, "size": len(data)}
    if same:
        return TaskResult(msg=f"{dest} unchanged", data=data_out)
    if not mc.check:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False, prefix=f".{dest.name}.") as tmp:
            tmp.write(data)
        os.replace(tmp.name, dest)
    return TaskResult(changed=True, msg=f"{'would fetch' if mc.check else 'fetched'} {args.src} -> {dest}",
                      data=data_out)
