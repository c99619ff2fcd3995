"""What each host holds of the models a release (or a folder) names: status, verification, removal.

The host half is ``fleetctl/remote/model_host.py``; this module chooses the models, builds its params
and reads its answers into ``ModelState`` (pure, apart from ``check_host`` / ``remove_on_host``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from fleetctl import hostpaths
from fleetctl.errors import HostError, RemoteOperationError
from fleetctl.models.ref import ModelRef
from fleetctl.transport.base import HostSession, Step

MODULE = "model_host"
BAD_STATES = ("missing", "incomplete", "corrupt", "revision", "unverified")
TIERS = ("quick", "deploy", "full")
# Hashing reads every byte it must (a first verification of a 700 GB model: some 10-60 minutes at disk
# speed), far past the per-command -T that fits everything else; a host that goes away still ends the call.
HASH_TIMEOUT = 6 * 3600.0


@dataclass(frozen=True)
class Problem:
    file: str  # relative to the model ("" for the model as a whole)
    kind: str  # missing | incomplete | corrupt | revision | unverified
    what: str


@dataclass(frozen=True)
class ModelState:
    """One model on one host."""

    role: str
    layout: str
    path: str
    state: str  # ok | one of BAD_STATES
    present: bool
    manifest: bool
    revision: str | None
    bytes: int | None
    files: int
    verified_at: float | None
    hashed_bytes: int
    free_bytes: int | None
    problems: tuple[Problem, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def first_problem(self) -> str:
        """One line naming the model and its first flawed file."""
        if not self.problems:
            return f"model {self.role}: ok"
        p = self.problems[0]
        where = f"{self.path.rstrip('/')}/{p.file}" if p.file else self.path
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        return f"model {self.role}: {where}: {p.what}{more}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["problems"] = [asdict(p) for p in self.problems]
        return out


def read_answer(ref: ModelRef, answer: dict[str, Any]) -> ModelState:
    problems = tuple(Problem(str(p["file"]), str(p["kind"]), str(p["what"])) for p in answer.get("problems") or [])
    return ModelState(ref.role, ref.layout, str(answer.get("path") or ref.path), str(answer["state"]),
                      bool(answer["present"]), bool(answer["manifest"]), answer.get("revision"), answer.get("bytes"),
                      int(answer.get("files") or 0), answer.get("verified_at"), int(answer.get("hashed_bytes") or 0),
                      answer.get("free_bytes"), problems)


def check_host(session: HostSession, refs: list[ModelRef], tier: str = "quick",
               timeout: float | None = None, progress: Callable[[int, int], None] | None = None) -> list[ModelState]:
    """Verify ``refs`` on one host at ``tier`` (quick | deploy | full); ``progress(hashed, total)``, if
    given, is told of the host's bytes hashed so far while it hashes (a few times a second)."""
    params = {"op": "verify", "tier": tier, "cache_dir": hostpaths.cache_dir(session.vars),
              "models": [r.host_params() for r in refs]}
    frames = None
    if progress is not None:
        def frames(doc: dict[str, Any]) -> None:
            progress(int(doc.get("bytes") or 0), int(doc.get("total") or 0))
    answer = session.call(MODULE, params, timeout=timeout or (None if tier == "quick" else HASH_TIMEOUT),
                          progress=frames)
    return [read_answer(ref, got) for ref, got in zip(refs, answer["models"], strict=True)]


def current_step(session: HostSession) -> Step:
    """The call that asks for the models of the release serving on the host, for a sequence."""
    return Step(MODULE, {"op": "current", "root": _root(session), "cache_dir": hostpaths.cache_dir(session.vars)})


def current_on_host(session: HostSession) -> list[ModelState]:
    """The models of the release serving on the host (its service.json), quick tier."""
    step = current_step(session)
    return current_from_answer(session.call(step.module, step.params))


def current_from_answer(answer: dict[str, Any]) -> list[ModelState]:
    """``current_step``'s answer -> the models' states."""
    refs = [ModelRef(str(r["key"]), str(r["layout"]), str(r.get("path") or r.get("cache")), r.get("repo"),
                     r.get("revision") or r.get("expect_revision")) for r in answer["refs"]]
    return [read_answer(ref, got) for ref, got in zip(refs, answer["models"], strict=True)]


def drift_rows(states: list[ModelState]) -> dict[str, str | None]:
    """``model <role>`` -> its revision (and its state when not ok): rows drift compares across hosts."""
    return {f"model {s.role}": (s.revision or "-") + ("" if s.ok else f" ({s.state})") for s in states}


def remove_on_host(session: HostSession, refs: list[ModelRef]) -> list[dict[str, Any]]:
    """Remove ``refs`` from one host; a model a kept release names is refused in one line."""
    params = {"op": "remove", "root": _root(session), "models": [r.host_params() for r in refs]}
    try:
        return list(session.call(MODULE, params)["models"])
    except RemoteOperationError as exc:
        if exc.etype == "ValueError":
            raise HostError(session.name, exc.remote_message) from None
        raise


def removal_text(answer: dict[str, Any]) -> str:
    """What ``remove_on_host`` did to one model, for the table."""
    done = "removed" if answer["removed"] else "not there"
    swept = answer.get("swept") or []
    return done + (f"; {len(swept)} leftovers of an older fleetctl's sync removed from snapshots/" if swept else "")


def _root(session: HostSession) -> str:
    """fleetctl_root as the releases see it (a template over host vars rendered, as release.service does)."""
    from fleetctl import templating

    try:
        value = templating.LazyVars(session.vars).get(hostpaths.ROOT_VAR)
    except templating.TemplateProblem as exc:
        raise HostError(session.name, f"host variables: {exc}") from None
    return hostpaths.root({hostpaths.ROOT_VAR: value})


def refusal(states: list[ModelState]) -> str | None:
    """Why a server must not start on these models, in one line; None when every one is fit."""
    bad = [s for s in states if not s.ok]
    return "; ".join(s.first_problem() for s in bad) if bad else None


def verified_when(at: float | None, now: float | None = None) -> str:
    if not at:
        return "never"
    age = (now or time.time()) - at
    for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60)):
        if age >= seconds:
            return f"{int(age // seconds)}{unit} ago"
    return "just now"


def size_text(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"
