"""A release's identity follows the base it was built from.

The release id is the hash of the spec and its files, the same on every host. A build also
records a fingerprint of the base venv it was cloned from (every distribution's RECORD digest).
When the base has changed since (repaired, overlaid, upgraded by hand), reusing that build would
serve the old base's files: the release is built again under ``<id>.b<fingerprint8>``, a new id
that names which base it holds. When the stale build is the one serving now, switching away from
it would surprise: that is refused in one line, and ``--rebuild`` asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetctl.errors import HostError, RemoteOperationError
from fleetctl.release.service import HostLayout
from fleetctl.transport.base import HostSession

MODULE = "release_base"


@dataclass(frozen=True)
class Identity:
    release_id: str  # what this deploy builds and switches to
    fingerprint: str  # of the base now
    rebuilt_from: str | None = None  # the stale build's id, when the base changed under it
    why: str = ""


def base_fingerprint(session: HostSession, site: str) -> str:
    return str(session.call(MODULE, {"op": "fingerprint", "site": site})["fingerprint"])


def built_fingerprint(session: HostSession, layout: HostLayout, release_id: str) -> tuple[bool, str | None]:
    answer = session.call(MODULE, {"op": "built_from", "root": layout.root, "release_id": release_id})
    return bool(answer["built"]), answer.get("fingerprint")


def choose(session: HostSession, layout: HostLayout, spec_id: str, site: str, current: str | None,
           rebuild: bool = False) -> Identity:
    now = base_fingerprint(session, site)
    built, then = built_fingerprint(session, layout, spec_id)
    stale = built and then is not None and then != now
    if not stale and not rebuild:
        return Identity(spec_id, now)
    fresh = f"{spec_id}.b{now[:8]}"
    if stale and current == spec_id and not rebuild:
        raise HostError(session.name, f"release {spec_id} is serving but was built from a base that has changed "
                                      f"since (fingerprint {(then or '')[:8]} -> {now[:8]}); pass --rebuild to "
                                      f"build it again as {fresh} and switch to that")
    why = (f"base changed since {spec_id} was built ({(then or '')[:8]} -> {now[:8]}): built again as {fresh}"
           if stale else f"--rebuild: built again as {fresh}")
    return Identity(fresh, now, spec_id, why)


def remove_release(session: HostSession, layout: HostLayout, release_id: str,
                   prune_bases: bool = True, check: bool = False) -> dict[str, Any]:
    """Remove one release folder; with ``prune_bases``, the base venvs built from a lock that no
    release uses any more go with it (``{"removed": path, "bases_removed": [paths]}``). ``check``:
    the same answer and refusals, nothing removed."""
    params = {"op": "remove", **layout.params(), "release_id": release_id, "prune_bases": prune_bases,
              "check": check}
    try:
        answer = session.call(MODULE, params)
        return {"removed": str(answer["removed"]), "bases_removed": list(answer.get("bases_removed") or [])}
    except RemoteOperationError as exc:
        if exc.etype == "ValueError":  # the host's own one-line refusal
            raise HostError(session.name, exc.remote_message) from None
        raise
