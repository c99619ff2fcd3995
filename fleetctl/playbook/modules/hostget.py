"""Playbook modules ``stat`` (what a host path is, with Ansible's result keys under ``stat``) and
``get_url`` (the host downloads a URL itself, checksum-verified, idempotent). Both call host-side
stdlib code (``remote/file_ops.py`` action stat, ``remote/get_url.py``): a large download never
passes through the controller or its SSH channel.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator

from fleetctl.playbook.modules.base import Args, ModuleContext, TaskResult, module
from fleetctl.playbook.modules.files import parse_mode, remote_call
from fleetctl.playbook.modules.hostfiles import _absolute, _octal

Algorithm = Literal["md5", "sha1", "sha224", "sha256", "sha384", "sha512"]
_CHECKSUM = re.compile(r"^(md5|sha1|sha224|sha256|sha384|sha512):([0-9A-Fa-f]+)$")


class StatArgs(Args):
    path: str = Field(validation_alias=AliasChoices("path", "dest", "name"))
    follow: bool = False
    get_checksum: bool = True
    checksum_algorithm: Algorithm = Field(default="sha1", validation_alias=AliasChoices(
        "checksum_algorithm", "checksum", "checksum_algo"))
    get_mime: bool = True  # accepted (Ansible's default), not reported
    get_attributes: bool = True  # accepted, not reported

    _path = field_validator("path")(_absolute)


@module("stat", StatArgs)
def stat(mc: ModuleContext, args: StatArgs) -> TaskResult:
    """A host path's facts, as Ansible's ``stat``: ``exists``, ``isdir``, ``isreg``, ``islnk``, ``size``,
    ``mode`` ("0644"), ``uid``/``gid``, ``pw_name``/``gr_name``, ``mtime``, ``checksum`` (sha1 by default)."""
    found = remote_call(mc, "file_ops", "FileOpsError", {
        "action": "stat", "path": args.path, "follow": args.follow,
        "checksum_algorithm": args.checksum_algorithm if args.get_checksum else None})
    word = "absent" if not found["exists"] else "directory" if found.get("isdir") else "present"
    return TaskResult(msg=f"{args.path}: {word}", data={"stat": found})


class GetUrlArgs(Args):
    url: str
    dest: str
    mode: str | None = None
    checksum: str | None = None
    force: bool = False
    timeout: float = Field(default=10, gt=0)

    _dest = field_validator("dest")(_absolute)
    _mode = field_validator("mode", mode="before")(_octal)

    @field_validator("checksum")
    @classmethod
    def _checksum(cls, value: str | None) -> str | None:
        if value and not _CHECKSUM.match(value):
            raise ValueError(f"checksum {value!r}: expected ALGORITHM:HEX such as 'sha256:9f86d0...'")
        return value or None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^(https?|ftp|file)://", value):
            raise ValueError(f"url {value!r}: expected an http, https, ftp or file URL")
        return value


@module("get_url", GetUrlArgs)
def get_url(mc: ModuleContext, args: GetUrlArgs) -> TaskResult:
    """Download ``url`` on the host to ``dest`` (a file, or a folder for the URL's file name), with
    ``mode``; ``checksum: sha256:HEX`` is verified before the file is put in place, and an existing
    dest whose checksum matches is kept without a download; ``force`` downloads again."""
    got = remote_call(mc, "get_url", "GetUrlError", get_url_params(mc, args))
    return get_url_result(got)


def get_url_params(mc: ModuleContext, args: GetUrlArgs) -> dict[str, Any]:
    """What the host side (remote/get_url.py) is given; ``async`` runs it as a host job."""
    return {"url": args.url, "dest": args.dest, "checksum": args.checksum, "force": args.force,
            "timeout": args.timeout, "check": mc.check, "mode": parse_mode(args.mode) if args.mode else None}


def get_url_result(got: dict[str, Any]) -> TaskResult:
    return TaskResult(changed=bool(got["changed"]), msg=f"{got['dest']}: {got['msg']}", data=got)
