"""``fleetctl models sync``: a model folder from one source to many hosts, each byte sent once.

1. The source's manifest (the kept one while it still matches the files, else hashed there).
2. Every target checks its own disk: already complete (nothing to send), which files it still lacks
   (a killed sync resumes per file), the free space of its volume: a target without room for what it
   lacks, or whose model path holds something else, is refused in one line before any byte moves.
3. Round one, the chain: the source sends the files anyone lacks to the first target, which writes
   them and forwards each chunk to the next while it writes it, and so on (``remote/model_chain.py``);
   a link that dies or stalls is cut and the hosts behind it re-attached past it.
4. Round two, the relay: targets still incomplete that the controller reaches are fed by the
   controller itself (a host that peers cannot reach, or a become that needs a password).
"""

from __future__ import annotations

import json
import posixpath
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from fleetctl import hostpaths
from fleetctl.errors import FleetError, HostError, InputError
from fleetctl.models import chain
from fleetctl.models.links import Events, HostTally, Tally, local_node, pump
from fleetctl.overlay.stream import stream_command
from fleetctl.transport.base import HostResult, Status, Stream
from fleetctl.transport.fleet import Fleet, HostContext
from fleetctl.transport.openssh import bulk_stream

MANIFEST_NAME = ".fleetctl-manifest.json"


@dataclass(frozen=True)
class SyncRequest:
    path: str  # the model folder on the targets (and on a source host)
    source: str | None  # a host holding the model, or None: ``source_dir`` on this machine
    source_dir: str | None = None
    limit_rate: float = 0.0  # bytes/s per link, 0: no cap
    stall_s: float = chain.DEFAULT_STALL_S
    revision: str | None = None  # the revision a release spec pins: the source must hold that one
    layout: str = "folder"  # or "hf_cache": path is <cache>/models--ORG--NAME/snapshots/<revision>
    cache: str | None = None  # hf_cache: the cache on the hosts (and on a source host)
    repo: str | None = None  # hf_cache: ORG/NAME
    hf_download: bool = False  # first `hf download` the revision on the source host (its hf_token from vault)

    def source_params(self) -> dict[str, Any]:
        if self.layout == "hf_cache":
            return {"action": "manifest", "layout": "hf_cache", "cache": self.cache, "repo": self.repo,
                    "revision": self.revision}
        return {"action": "manifest", "path": self.path}

    def source_root(self, local: bool) -> str:
        """Where the source's node reads the files the chain sends: the folder, or the cache's blobs/."""
        if self.layout == "hf_cache":
            cache = (self.source_dir if local else self.cache) or ""
            return posixpath.join(cache, "models--" + (self.repo or "").replace("/", "--"), "blobs")
        return (self.source_dir if local else self.path) or ""


@dataclass
class SyncOutcome:
    state: str  # "synced" | "complete" (nothing to send)
    written: int = 0
    via: str = ""  # "chain" | "relay" | ""
    cuts: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "bytes_written": self.written, "via": self.via, "cuts": self.cuts}


@dataclass
class SyncReport:
    request: SyncRequest
    manifest: dict[str, Any]
    results: dict[str, HostResult[SyncOutcome]]
    source_bytes_sent: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)  # seconds: manifest, check, chain_ready, chain, relay

    def summary(self) -> str:
        ok = sum(1 for r in self.results.values() if r.ok)
        sent = sum(1 for r in self.results.values() if r.ok and r.value and r.value.state == "synced")
        return (f"{len(self.results)} targets: {ok} complete ({sent} synced now), {len(self.results) - ok} failed; "
                f"the source sent {self.source_bytes_sent:,} B of a {self.manifest['total_bytes']:,} B model "
                f"in {self.seconds:.1f}s")


def host_files_module() -> ModuleType:
    """remote/model_files.py as the hosts run it, for a source folder on this machine."""
    from fleetctl.transport.agent import module_source

    module = ModuleType("fleetctl_remote_model_files")
    exec(compile(module_source("model_files")[0], "model_files.py", "exec"), module.__dict__)  # noqa: S102
    return module


def source_manifest(req: SyncRequest, source: HostContext | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The model's manifest at the source, and (hf_cache) each file's blob name."""
    if source is None:
        assert req.source_dir is not None
        params = {**req.source_params(), "path": req.source_dir, "cache": req.source_dir}
        found = host_files_module().main(params)
        where = req.source_dir
    else:  # the source's verified-hash store: a file hashed before, unchanged since, is not read again
        found = source.call("model_files", {**req.source_params(), "cache_dir": hostpaths.cache_dir(source.vars)})
        where = f"{source.name}:{req.cache if req.layout == 'hf_cache' else req.path}"
    if found.get("error"):
        raise InputError(f"--from {where}: {found['error']}")
    doc: dict[str, Any] = found["manifest"]
    if not doc["files"]:
        raise InputError(f"--from {where}: the folder holds no files")
    if req.revision and doc["revision"] != req.revision:
        raise InputError(f"--from {where}: holds revision {doc['revision']}, the spec pins {req.revision}")
    return doc, found.get("blobs") or {}


def wire_files(manifest: dict[str, Any], blobs: dict[str, str]) -> tuple[list[list[Any]], list[list[str]]]:
    """What the chain sends ([[name, size, sha256]]) and, for a HF snapshot, its links ([[path, blob]]):
    a folder's files by path; a snapshot's blobs once each, however many paths link to one."""
    if not blobs:
        return [[f["path"], f["size"], f["sha256"]] for f in manifest["files"]], []
    sent: dict[str, list[Any]] = {}
    for f in manifest["files"]:
        sent.setdefault(blobs[f["path"]], [blobs[f["path"]], f["size"], f["sha256"]])
    return sorted(sent.values()), [[f["path"], blobs[f["path"]]] for f in manifest["files"]]


def check_targets(targets: Fleet, req: SyncRequest, plan: chain.SyncPlan) -> dict[str, HostResult[Any]]:
    """Each target's answer. A path locked by a sync whose controller was this machine and is dead (a
    SIGKILLed run: its nodes can outlive it a moment) is stale: its token joins ``plan.stale_syncs`` and
    the host is asked again, so this sync takes that lock over."""
    params = {"action": "check", "dest": req.path, "files": plan.files, "manifest_name": MANIFEST_NAME,
              "layout": req.layout, "links": plan.links, "holder": plan.holder}  # holder: a check may lock
    from fleetctl.liveness import holder_alive

    found = targets.map(lambda ctx: ctx.call("model_files", params))
    again = []
    for name, res in found.items():
        holder = lock_holder(res)
        if holder.get("sync") and holder_alive(holder) is False:
            plan.stale_syncs.append(holder["sync"])
            again.append(name)
    if again:
        retry = {**params, "stale_syncs": plan.stale_syncs}
        found.update(targets.map(lambda ctx: ctx.call("model_files", retry), names=again))
    return found


def lock_holder(res: HostResult[Any]) -> dict[str, Any]:
    """The controller-side holder of the sync lock a host's check answer reports, else {}."""
    lock = (res.value or {}).get("holder") if res.ok and isinstance(res.value, dict) else None
    holder = lock.get("holder") if isinstance(lock, dict) else None
    return holder if isinstance(holder, dict) else {}


def refusal(host: str, found: Mapping[str, Any], path: str) -> str | None:
    if found.get("locked"):
        return f"{host}: {path} is {found['locked']}"
    if found.get("foreign") and found.get("why"):
        return f"{host}: {found['why']}"
    if found.get("foreign"):
        return (f"{host}: {path} exists and is not this model revision (no matching manifest); "
                "remove it or sync to another path")
    if not found.get("complete") and found["free"] < found["room_needed"]:
        return (f"{host}: no room for the model: {found['free']:,} B free on the volume of {path}, "
                f"{found['room_needed']:,} B needed")
    return None


class Sync:
    """One sync's state across its rounds."""

    def __init__(self, req: SyncRequest, source: HostContext | None, targets: Fleet,
                 on_change: Callable[[Tally], None] | None) -> None:
        self.req, self.source, self.targets = req, source, targets
        started = time.monotonic()
        self.early = chain.EarlyWarm(source, list(targets.contexts.values()))  # beside the manifest and checks
        self.manifest, blobs = source_manifest(req, source)
        self.phases = {"manifest": time.monotonic() - started}
        self.files, self.links = wire_files(self.manifest, blobs)
        self.plan = chain.SyncPlan(self.files, req.path, MANIFEST_NAME, manifest_text(self.manifest),
                                   req.limit_rate, req.stall_s, req.layout, self.links, sync_holder(req))
        self.results: dict[str, HostResult[SyncOutcome]] = {}
        self.tally = Tally({}, on_change=on_change)
        self.via: dict[str, str] = {}

    def run(self) -> SyncReport:
        try:
            return self.rounds()
        finally:
            self.early.result()  # no warming thread outlives the sync

    def rounds(self) -> SyncReport:
        started = time.monotonic()
        pending = self.precheck()
        self.phases["check"] = time.monotonic() - started
        if pending:
            mark = time.monotonic()
            self.chain_round(pending)
            self.phases["chain"] = time.monotonic() - mark
            left = [ctx for ctx in pending if not self.tally.hosts[ctx.name].ok
                    and not self.tally.hosts[ctx.name].refused]
            if left:
                mark = time.monotonic()
                self.relay_round(left)
                self.phases["relay"] = time.monotonic() - mark
            for ctx in pending:
                self.results[ctx.name] = self.outcome(ctx.name)
        ordered = {name: self.results[name] for name in self.targets.contexts if name in self.results}
        return SyncReport(self.req, self.manifest, ordered, self.tally.source_sent,
                          time.monotonic() - started + self.phases["manifest"],
                          {k: round(v, 3) for k, v in self.phases.items()})

    def precheck(self) -> list[HostContext]:
        pending = []
        for host, res in check_targets(self.targets, self.req, self.plan).items():
            if not res.ok:
                self.results[host] = HostResult(host, res.status, reason=res.reason, details=res.details)
                continue
            found: dict[str, Any] = res.value or {}
            why = refusal(host, found, self.req.path)
            if why:
                self.results[host] = HostResult(host, Status.FAILED, reason=why)
            elif found["complete"]:
                self.results[host] = HostResult(host, Status.OK, SyncOutcome("complete"))
            else:
                self.tally.hosts[host] = HostTally(need_bytes=found["need_bytes"])
                pending.append(self.targets.contexts[host])
        return pending

    def chain_round(self, pending: list[HostContext]) -> None:
        entries, refused = chain.chain_entries(pending, first_from_controller=self.source is None)
        for host, why in refused.items():
            self.tally.hosts[host].cuts.append(why)
        if not entries:
            return
        senders = [ctx for ctx in pending if ctx.name in {e["host"] for e in entries}]
        keys = chain.link_keys([*([self.source] if self.source else []), *senders])
        token = self.early.result()
        if token is None or self.early.hosts != [e["host"] for e in entries]:  # not the chain warmed early
            token = chain.warm_links(self.source, senders, entries, keys)
        entries = chain.through_warmed(entries, token, first_direct=self.source is None)
        head = self.source.name if self.source else "(controller)"
        doc = self.plan.doc("source", head, [entries], keys, src=self.req.source_root(self.source is None))
        try:
            stream = self.open_head(self.source, doc)
        except FleetError as exc:
            raise HostError(head, f"cannot start the source: {exc}") from None
        try:
            events = Events(stream, self.tally, head, source=True)
            mark = time.monotonic()
            events.until_ready()  # every link attached: the chain's start, before the first byte
            self.phases["chain_start"] = time.monotonic() - mark
            why = events.drain()
        finally:
            stream.close()
        for entry in entries:
            self.via.setdefault(entry["host"], "chain")
        if why:
            for entry in entries:
                self.tally.hosts[entry["host"]].cuts.append(f"the source {head} failed: {why}")

    def relay_round(self, left: list[HostContext]) -> None:
        branches, refused = chain.star_entries(left)
        for host, why in refused.items():
            self.tally.hosts[host].cuts.append(why)
        if not branches:
            return
        for branch in branches:
            self.via[branch[0]["host"]] = "relay"
        if self.source is None:  # the controller is the source: a star straight from its folder
            doc = self.plan.doc("source", "(controller)", branches, {}, src=self.req.source_root(True))
            stream = self.open_head(None, doc)
            try:
                Events(stream, self.tally, "(controller)", source=True).drain()
            finally:
                stream.close()
            return
        relay = self.open_head(None, self.plan.doc("relay", "(relay)", branches, {}))
        try:
            events = Events(relay, self.tally, "(relay)", source=False)
            need = events.until_ready()
            feed = bulk_stream(self.source.connector, chain.link_command(self.source))
            feed.send(chain.plan_bytes(self.plan.doc("feed", self.source.name, [], {}, src=self.req.source_root(False),
                                                     send=sorted(need))))
            carrier = pump(feed, relay, self.tally)
            events.drain()
            carrier.join(timeout=10)
            feed.close()
        finally:
            relay.close()

    def open_head(self, source: HostContext | None, doc: dict[str, Any]) -> Stream:
        stream: Stream
        if source is None:
            stream = local_node(stream_command(chain.CHAIN_MODULE, "python3"))
        else:
            stream = bulk_stream(source.connector, chain.link_command(source))
        stream.send(chain.plan_bytes(doc))
        return stream

    def outcome(self, host: str) -> HostResult[SyncOutcome]:
        t = self.tally.hosts[host]
        value = SyncOutcome("synced", t.written, self.via.get(host, ""), t.cuts)
        if t.ok:
            return HostResult(host, Status.OK, value)
        why = t.refused or "; ".join([*t.errors, *t.cuts[-2:]]) or t.lost or "no answer from its link"
        status = Status.UNREACHABLE if any("Connection refused" in c or "timed out" in c for c in t.cuts) \
            and not t.errors else Status.FAILED
        return HostResult(host, status, value, reason=f"incomplete, re-run to resume: {why}")


def sync_holder(req: SyncRequest) -> dict[str, Any]:
    """Who this sync is, as the lock on each target names it; its token lets its own later nodes take it."""
    from fleetctl.liveness import who

    return {**who(f"models sync {req.path}"), "sync": secrets.token_hex(8)}


def manifest_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


HF_DOWNLOAD_TIMEOUT = 24 * 3600.0
HF_TOKEN_VAR = "hf_token"


def hf_download(req: SyncRequest, source: HostContext) -> dict[str, Any]:
    """``hf download`` of the pinned revision into the source host's cache. The host var hf_token must
    be vault-encrypted; it reaches the host inside the agent's request and ``hf`` in its environment."""
    from fleetctl.vault import VaultStr

    token = source.vars.get(HF_TOKEN_VAR)
    if token is not None and not isinstance(token, VaultStr):
        raise InputError(f"{source.name}: host var {HF_TOKEN_VAR} must be vault-encrypted (!vault): it is a secret")
    params = {"cache": req.cache, "repo": req.repo, "revision": req.revision, "token": token or None}
    found: dict[str, Any] = source.call("model_hf", params, timeout=HF_DOWNLOAD_TIMEOUT)
    if found.get("error"):
        raise HostError(source.name, f"--hf-download {req.repo}@{req.revision}: {found['error']}")
    return found


def run_sync(req: SyncRequest, source: HostContext | None, targets: Fleet,
             on_change: Callable[[Tally], None] | None = None) -> SyncReport:
    took = 0.0
    if req.hf_download:
        if source is None or req.layout != "hf_cache":
            raise InputError("--hf-download needs --from a host and a Hugging Face cache model (hf_cache)")
        started = time.monotonic()
        hf_download(req, source)
        took = time.monotonic() - started
    report = Sync(req, source, targets, on_change).run()
    if req.hf_download:
        report.phases["hf_download"] = round(took, 3)
        report.seconds += took
    return report
