"""Stage, then switch: a release built, patched, validated and verified on a host ahead of its switch.

Capistrano uploads everywhere first and switches afterwards; so does ``release state: staged``
(``fleetctl deploy --stage``): the build half of a deploy (base, inspect, patches, build, SGLang's
own parser on the launch args) runs, then every patched and kernel file of the release is checked
against its manifest and ``RELEASE/staged.json`` records what was staged. A later deploy of the same
spec on that host finds the record (same spec digest, the base unchanged since) and only switches,
restarts and gates: the build is reused, not redone inside the batch that took the host out of
service. A base that changed since staging, or another spec, is built as an ordinary deploy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetctl.errors import HostError, RemoteOperationError
from fleetctl.release.service import HostLayout
from fleetctl.release.spec import ReleaseSpec
from fleetctl.transport.base import HostSession

MODULE = "release_base"


@dataclass(frozen=True)
class Staged:
    release_id: str | None  # the staged build to switch to, None: not staged (why says so)
    why: str = ""
    record: dict[str, Any] | None = None


def find_staged(session: HostSession, spec: ReleaseSpec, layout: HostLayout) -> Staged:
    answer = session.call(MODULE, {"op": "staged", "root": layout.root, "release_id": spec.release_id,
                                   "spec_digest": spec.digest})
    rid = answer.get("release_id")
    return Staged(str(rid) if rid else None, str(answer.get("why") or ""), answer.get("record"))


def record_staged(session: HostSession, layout: HostLayout, release_id: str, spec: ReleaseSpec, site: str,
                  launch: dict[str, Any] | None) -> int:
    """Verify the built release against its manifest and mark it staged; the files checked."""
    record = {"spec_digest": spec.digest, "spec": spec.path.name, "site": site, "launch": launch}
    try:
        answer = session.call(MODULE, {"op": "stage", "root": layout.root, "release_id": release_id,
                                       "record": record}, timeout=1800)
    except RemoteOperationError as exc:
        if exc.etype == "ValueError":  # the host's own one-line verdict: a file differs or is missing
            raise HostError(session.name, f"{exc.remote_message}; nothing switched") from None
        raise
    return int(answer["verified"])
