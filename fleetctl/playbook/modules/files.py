"""Playbook modules ``copy`` and ``template``: one file on the host holds exactly this content.

Decide, then do: the host says what the file holds now (``remote/files.py`` stat: hash, mode,
and the text when it is small enough to diff); the controller compares it with the wanted bytes
and mode, and only then writes (atomically: a temporary file in the same folder created with the
final mode, then a rename). Check mode stops after the comparison. A missing parent folder is a
failure, never created silently.

Secrets: when the content holds the value of a variable named in the host's ``secret_vars``,
the file's default mode is 0600 and every diff or message shows the mask instead of the value.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from pydantic import field_validator, model_validator

from fleetctl.errors import HostError, InputError, RemoteOperationError
from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module
from fleetctl.secrets import MASK, mask_values, secret_values
from fleetctl.vault import is_encrypted

MAX_CONTENT = 64 * 1024 * 1024  # travels in one agent message (base64): config files, not data sets
MAX_DIFF_TEXT = 256 * 1024  # host files up to this size come back as text, to diff
NEW_FILE_MODE = 0o644
SECRET_MODE = 0o600
_MODE = re.compile(r"^0?[0-7]{3,4}$")


def parse_mode(value: str) -> int:
    """``"0644"`` / ``"644"`` / ``"01777"`` -> int; anything else is refused."""
    if not _MODE.match(value):
        raise ValueError(f"mode {value!r}: expected an octal string such as \"0644\"")
    return int(value, 8)


def format_mode(mode: int | None) -> str:
    return "-" if mode is None else f"{mode:04o}"


class FileArgs(Args):
    dest: str
    mode: str | None = None

    @field_validator("dest")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or "\0" in value or value.endswith("/"):
            raise ValueError(f"dest {value!r}: expected an absolute path of a file on the host")
        return value

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            # YAML reads an unquoted 0644 as the number 420: the intent is lost, so ask for quotes.
            raise ValueError(f"mode {value}: quote it, as an octal string such as \"0644\"")
        if isinstance(value, str):
            parse_mode(value)
        return value

    @property
    def mode_bits(self) -> int | None:
        return None if self.mode is None else parse_mode(self.mode)


class CopyArgs(FileArgs):
    src: str | None = None  # a file on the controller, relative to the playbook's folder
    content: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> CopyArgs:
        if (self.src is None) == (self.content is None):
            raise ValueError("copy needs exactly one of src (a controller file) and content")
        return self


class TemplateArgs(FileArgs):
    src: str  # a Jinja2 file on the controller, relative to the playbook's folder


# --- pure helpers --------------------------------------------------------------------------------

def mask_old(old: str, new_masked: str, secrets: list[str]) -> str:
    """The host's old text as a diff may show it. Known secret values are masked; so are values the
    vars no longer hold (a rotated token): an old line replaced by a line holding a secret is masked
    in the same places when it has the same shape (``TOKEN=old`` vs ``TOKEN=********``), else whole.
    In a replaced block of another length every old line is such a candidate."""
    old_lines = mask_values(old, secrets).splitlines(True)
    new_lines = new_masked.splitlines(True)
    out: list[str] = []
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        block, new_block = old_lines[i1:i2], new_lines[j1:j2]
        shapes = [line for line in new_block if MASK in line]
        if tag == "replace" and shapes:
            if len(block) == len(new_block):  # line for line: only lines replaced by a secret line
                block = [_masked_like(o, [n]) if MASK in n else o for o, n in zip(block, new_block, strict=True)]
            else:
                block = [_masked_like(line, shapes) for line in block]
        out.extend(block)
    return "".join(out)


def _masked_like(line: str, shapes: list[str]) -> str:
    body, end = (line[:-1], "\n") if line.endswith("\n") else (line, "")
    for shape in shapes:
        parts = shape.rstrip("\n").split(MASK)
        if re.fullmatch("(.+?)".join(re.escape(p) for p in parts), body, re.S):
            return MASK.join(parts) + end
    return MASK + end


def holds_secret(data: bytes, secrets: list[str]) -> bool:
    return any(value.encode() in data for value in secrets)


def as_text(data: bytes) -> str | None:
    """The bytes as text when a line diff makes sense: UTF-8 without NUL."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class HostFile:
    """What the host's file is now (``remote/files.py`` stat)."""

    exists: bool
    kind: str | None
    mode: int | None
    size: int | None
    sha256: str | None
    text: str | None
    parent: str
    parent_exists: bool

    @classmethod
    def from_remote(cls, raw: Mapping[str, Any]) -> HostFile:
        return cls(bool(raw["exists"]), raw.get("kind"), raw.get("mode"), raw.get("size"), raw.get("sha256"),
                   raw.get("text"), str(raw["parent"]), bool(raw["parent_exists"]))


@dataclass(frozen=True)
class FilePlan:
    """What must change (pure): content, mode, both or nothing."""

    create: bool
    content: bool
    mode: int
    old_mode: int | None

    @property
    def changed(self) -> bool:
        return self.create or self.content or self.mode != self.old_mode


def plan_file(now: HostFile, data: bytes, wanted_mode: int | None, secret: bool) -> FilePlan:
    """The mode: the one asked for; else 0600 for content holding a secret; else the file's own
    mode (a new file gets 0644)."""
    if wanted_mode is None:
        wanted_mode = SECRET_MODE if secret else (now.mode if now.exists and now.mode is not None
                                                  else NEW_FILE_MODE)
    same = now.exists and now.sha256 == hashlib.sha256(data).hexdigest()
    return FilePlan(not now.exists, not same, wanted_mode, now.mode if now.exists else None)


def file_diff(dest: str, now: HostFile, data: bytes, plan: FilePlan, secrets: list[str]) -> str:
    """A unified diff of the text (secrets masked), or a line saying why there is none; the mode
    change on a line of its own."""
    lines: list[str] = []
    if plan.mode != plan.old_mode:
        lines.append(f"mode: {format_mode(plan.old_mode)} -> {format_mode(plan.mode)}\n")
    if plan.content:
        new = as_text(data)
        old = "" if plan.create else now.text
        if new is None or old is None:
            large = new is not None and (now.size or 0) > MAX_DIFF_TEXT
            why = f"{now.size} B on the host, not diffed" if large else "binary"
            # A hash of content holding a secret would let a short secret be guessed offline.
            hashes = "" if holds_secret(data, secrets) else \
                f"; sha256 {now.sha256 or '-'} -> {hashlib.sha256(data).hexdigest()}"
            lines.append(f"content differs ({why}{hashes})\n")
        else:
            after = mask_values(new, secrets)
            before = mask_old(old, after, secrets) if secrets else old
            text = "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                                "/dev/null" if plan.create else f"a{dest}", f"b{dest}"))
            lines.append(text if text.endswith("\n") or not text else text + "\n")
            if before == after:
                lines.append("content differs only in secret values (masked)\n")
    return "".join(lines)


def plan_message(dest: str, plan: FilePlan, size: int, check: bool) -> str:
    if not plan.changed:
        return f"{dest} unchanged"
    verb = ("would create" if check else "created") if plan.create else ("would update" if check else "updated")
    if plan.create or plan.content:
        return f"{verb} {dest} ({size} B, mode {format_mode(plan.mode)})"
    return f"{verb} the mode of {dest}: {format_mode(plan.old_mode)} -> {format_mode(plan.mode)}"


# --- doing it ------------------------------------------------------------------------------------

def remote_call(mc: ModuleContext, module: str, error_type: str, params: dict[str, Any]) -> Any:
    """Call a host-side module; its own refusal (``error_type``) is the host's one-line failure."""
    try:
        return mc.session.call(module, params)
    except RemoteOperationError as exc:
        if exc.etype == error_type:
            raise HostError(mc.host, exc.remote_message) from None
        raise


def _call(mc: ModuleContext, params: dict[str, Any]) -> Any:
    return remote_call(mc, "files", "FilesError", params)


def host_file(mc: ModuleContext, dest: str) -> HostFile:
    # The text travels only when a diff will be shown.
    now = HostFile.from_remote(_call(mc, {"action": "stat", "path": dest, "max_text": MAX_DIFF_TEXT if mc.diff else 0}))
    if not now.parent_exists:
        raise HostError(mc.host, f"{dest}: parent folder {now.parent} does not exist (create it first)")
    if now.exists and now.kind != "file":
        raise HostError(mc.host, f"{dest} is a {now.kind}, not a file")
    return now


def ensure_file(mc: ModuleContext, dest: str, data: bytes, wanted_mode: int | None,
                is_secret: bool = False) -> TaskResult:
    """The shared body of ``copy`` and ``template``: compare, then write when something differs.
    ``is_secret``: the whole content is a secret (a vault-encrypted source), as if it held one."""
    if len(data) > MAX_CONTENT:
        raise InputError(f"{dest}: {len(data)} bytes; copy/template take at most {MAX_CONTENT}")
    secrets = secret_values(mc.vars)
    if is_secret:  # the whole text is the secret, and each of its lines (a diff shows lines)
        text = data.decode("utf-8", "replace")
        secrets = sorted({text, *(line for line in text.splitlines() if line.strip()), *secrets},
                         key=lambda v: (-len(v), v))
    secret = is_secret or holds_secret(data, secrets)
    now = host_file(mc, dest)
    plan = plan_file(now, data, wanted_mode, secret)
    result = TaskResult(changed=plan.changed, msg=mask_values(plan_message(dest, plan, len(data), mc.check), secrets))
    result.diff = file_diff(dest, now, data, plan, secrets) if mc.diff and plan.changed else ""
    result.data = {"dest": dest, "size": len(data), "mode": format_mode(plan.mode),
                   "created": plan.create and not mc.check, "secret": secret}
    if not secret:  # see file_diff: no hash of a secret's file leaves the module
        result.data["sha256"] = hashlib.sha256(data).hexdigest()
    if plan.changed and not mc.check:
        _call(mc, {"action": "write", "path": dest, "data_b64": base64.b64encode(data).decode("ascii"),
                   "mode": plan.mode, "expect_sha256": now.sha256})
    return result


def read_source(path: Path, what: str) -> bytes:
    if path.is_dir():
        raise InputError(f"{what} {path}: a folder; {what} takes one file")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read it: {exc.strerror or exc}") from None


def _template_line(exc: BaseException) -> int | None:
    """The template line a Jinja2 error happened on (syntax errors carry it, runtime ones in the traceback)."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def render_template(mc: ModuleContext, path: Path) -> str:
    try:
        text = read_source(path, "template src").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"template src {path}: not UTF-8 text ({exc.reason})") from None
    try:
        return mc.run.render(text, mc.vars)
    except jinja2.TemplateError as exc:
        line = _template_line(exc)
        where = f"{path}:{line}" if line else str(path)
        raise InputError(f"{where}: {type(exc).__name__}: {exc.message or exc}") from None


@module("copy", CopyArgs)
def copy(mc: ModuleContext, args: CopyArgs) -> TaskResult:
    """Put a controller file (``src``, relative to the playbook) or ``content`` at ``dest`` on the host."""
    data = args.content.encode("utf-8") if args.content is not None else read_source(mc.path(args.src or ""), "src")
    vaulted = args.content is None and is_encrypted(data)
    if vaulted:  # an ansible-vault encrypted source: its plaintext goes to the host, as Ansible's copy does
        data = mc.run.vault.decrypt(data.decode("ascii", "replace"), f"src {mc.path(args.src or '')}")
    return ensure_file(mc, args.dest, data, args.mode_bits, is_secret=vaulted)


@module("template", TemplateArgs)
def template(mc: ModuleContext, args: TemplateArgs) -> TaskResult:
    """Render the Jinja2 file ``src`` (relative to the playbook) with the host's variables to ``dest``."""
    text = render_template(mc, mc.path(args.src, "templates"))
    return ensure_file(mc, args.dest, text.encode("utf-8"), args.mode_bits)
