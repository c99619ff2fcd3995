"""``fleetctl venv overlay``, the file stream: one source stream per group of targets needing the
same files. The source writes the files whose hash differs to its stream (uncompressed by default),
the controller forwards each frame to every target's stream as it arrives, and each target lands
files while later ones are still on the wire; the bytes move through OpenSSH client processes
(``transport/openssh.py``). With ``--direct`` each target pulls its own stream from the source."""

from __future__ import annotations

import json
import re
import shlex
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fleetctl import hostpaths, ssh_options
from fleetctl.connection import ConnectionSpec
from fleetctl.errors import HostError
from fleetctl.overlay.plan import HostPlan, OverlayRequest, SourceListing
from fleetctl.transport.agent import module_source
from fleetctl.transport.agent_boot import start_code
from fleetctl.transport.base import HostSession, Stream
from fleetctl.transport.fleet import HostContext
from fleetctl.transport.openssh import (  # the file stream: OpenSSH moves the bytes
    bulk_stream,
    keepalive_options,
)
from fleetctl.transport.target import SSHTarget

STREAM_MAGIC = b"\x00FLEETCTL-OVERLAY-1\n"
BEGIN, END = b"@@FLEETCTL-JSON-BEGIN@@", b"@@FLEETCTL-JSON-END@@"


@dataclass(frozen=True)
class Applied:
    written: int
    removed: int
    bytes_in: int
    seconds: float
    manifest: str
    via: str = "controller"  # "direct": the target pulled the stream from the source itself


def python_of(venv: str) -> str:
    return f"{venv.rstrip('/')}/bin/python"


def target_dirs(session: HostSession) -> dict[str, str]:
    """Where a target keeps its hash cache and its overlay journal and manifests (host vars)."""
    return {"cache_dir": hostpaths.cache_dir(session.vars), "state_dir": hostpaths.overlays_dir(session.vars)}


# --- the stream ------------------------------------------------------------------------------------

def stream_command(module: str, python: str) -> str:
    """Run a remote module's ``stream_main`` under ``python``, its source inline (as the agent is), its
    compiled code kept in the agent's private code cache (``agent_boot``: 20-50 ms of every stream
    process's start, on the way to a fresh overlay's first byte); a missing python says so in one
    line (``calls.NO_PYTHON``) and exits 127."""
    code = start_code(*module_source(module), "__main__")  # the module's ``if __name__ == "__main__"`` runs
    q = shlex.quote(python)
    there = f"[ -x {q} ]" if "/" in python else f"command -v {q} >/dev/null"  # a path, or a name on PATH
    return (f"if {there}; then exec {q} -c {shlex.quote(code)}; fi; "
            f"echo {shlex.quote('fleetctl: InterpreterNotFound: no python at ' + python)} >&2; exit 127")


class Opened(Protocol):
    def take(self) -> Stream | None: ...


def open_stream(opened: Mapping[str, Opened] | None, ctx: HostContext, module: str, python: str) -> Stream:
    """``module``'s stream process on ``ctx``: the one its listing calls ran on (``calls.py``: started
    as the command started, so its connect is long done), else a new one."""
    found = opened.get(ctx.name) if opened is not None else None
    taken = found.take() if found is not None else None
    return taken if taken is not None else bulk_stream(ctx.connector, stream_command(module, python))


DIRECT_KEY_VAR = "direct_ssh_key"  # host var: the key file on the target for reaching the source


def direct_argv(source: HostContext, target: HostContext, command: str) -> list[str]:
    """The ssh the target runs to reach the source (the source's inventory connection settings);
    host keys are checked against the target's own known_hosts, never skipped. A jump chain is a
    ProxyCommand per hop with the same strict options, not ``-J``: OpenSSH applies command-line
    options to the destination only, so a hop of ``-J`` would follow the target's ssh_config
    (``StrictHostKeyChecking no`` there would accept any bastion key)."""
    spec = source.host.connection
    if spec.kind != "ssh":
        raise HostError(target.name, f"--direct: {source.name} is not reached over ssh (connection {spec.kind})")
    strict = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
              "-o", f"ConnectTimeout={max(1, int(spec.connect_timeout))}"]
    key = target.vars.get(DIRECT_KEY_VAR)
    if key is not None:
        if not isinstance(key, str) or not key:
            raise HostError(target.name, f"{DIRECT_KEY_VAR} must be a path on {target.name}")
        strict += ["-o", "IdentitiesOnly=yes", "-i", key]
    strict += keepalive_options(*alive_settings(spec))
    argv = ["ssh", *strict]
    proxy = None
    for user, host, port in jump_hops(source, target.name):
        hop_argv = ["ssh", *strict, *(["-o", f"ProxyCommand={proxy}"] if proxy else []), "-p", port,
                    *(["-l", user] if user else []), "-W", "%h:%p", "--", host]
        # OpenSSH expands %-tokens of a ProxyCommand once per level: inner ones are doubled.
        proxy = " ".join(a if a == "%h:%p" else shlex.quote(a.replace("%", "%%")) for a in hop_argv)
    if proxy:
        argv += ["-o", f"ProxyCommand={proxy}"]
    argv += ["-p", str(spec.port), "--", f"{spec.user}@{spec.hostname}" if spec.user else spec.hostname, command]
    return argv


HOP_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def jump_hops(source: HostContext, target: str) -> list[tuple[str, str, str]]:
    """The source's bastion chain, first hop first, as (user, host, port): as the controller resolved
    it (an inventory name is that host's address, user and port; ssh_config's ProxyJump too), else
    the ``[user@]host[:port]`` strings of its jump_host. Each part plain: it reaches a shell."""
    resolved = getattr(source.connector, "target", None)
    hops: list[str] = []
    if isinstance(resolved, SSHTarget):
        via = resolved.jump
        while via is not None:
            hops.insert(0, f"{via.user}@{via.hostname}:{via.port}")
            via = via.jump
    else:
        jump = source.host.connection.jump
        hops = jump.split(",") if jump else []
    found: list[tuple[str, str, str]] = []
    for hop in hops:
        user, _, rest = hop.rpartition("@")
        host, _, port = rest.partition(":")
        if not HOP_PART.fullmatch(host) or (user and not HOP_PART.fullmatch(user)) or (port and not port.isdigit()):
            raise HostError(target, f"--direct: jump host {hop!r} must be [user@]host[:port] of letters, digits, . _ -")
        found.append((user, host, port or "22"))
    return found


def alive_settings(spec: ConnectionSpec) -> tuple[float, int]:
    """The source's keepalives from its inventory ssh args, else the defaults (the target's own ssh
    reads its own ssh_config after these)."""
    interval = spec.alive_interval if spec.alive_interval is not None else ssh_options.DEFAULT_ALIVE_INTERVAL
    count = spec.alive_count_max if spec.alive_count_max is not None else ssh_options.DEFAULT_ALIVE_COUNT_MAX
    return interval, count


def direct_failure(host: str, source: str, why: str) -> str:
    """One line for a target that could not reach the source itself."""
    if "host key" in why.lower():
        hint = f"pin {source}'s key in {host}'s ~/.ssh/known_hosts"
    elif "permission denied" in why.lower() or "identity file" in why.lower():
        hint = f"give {host} a key that {source} accepts (host var {DIRECT_KEY_VAR})"
    else:
        hint = f"check that {host} can reach {source} over ssh"
    return f"{host} cannot reach {source} directly: {why}; {hint} or drop --direct"


def frame(doc: Any) -> bytes:
    data = json.dumps(doc).encode()
    return struct.pack(">I", len(data)) + data


def send_order(src: SourceListing, plan: HostPlan) -> list[list[str]]:
    """Package files first, then each dist-info with RECORD last: the target writes those last."""
    body: list[list[str]] = []
    meta: list[list[str]] = []
    for d in plan.dists:
        info = src.dists[d.name]
        for rel in d.send:
            (meta if info.is_meta(rel) else body).append([d.dist_info, rel])
    meta.sort(key=lambda item: (item[0], item[1].endswith("/RECORD"), item[1]))
    return body + meta


def target_params(src: SourceListing, plan: HostPlan, req: OverlayRequest) -> dict[str, Any]:
    changed = [d for d in plan.dists if d.changes]
    manifest = {
        "schema": 1, "source_host": src.host, "source_venv": req.venv.rstrip("/"), "target_venv": req.target_venv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dists": [{"name": d.name, "version": d.new_version, "old_version": d.old_version, "action": d.action.value,
                   "dist_info": d.dist_info, "files": {f.rel: f.sha256 for f in src.dists[d.name].files}}
                  for d in changed],
    }
    return {
        "expect": [rel for d in changed for rel in d.send], "remove": [rel for d in changed for rel in d.remove],
        "remove_dist_infos": [i for d in changed for i in d.remove_dist_infos],
        "new_dist_infos": {d.dist_info: [f.rel for f in src.dists[d.name].files if f.rel.startswith(d.dist_info + "/")]
                           for d in changed},
        "manifest": manifest, "throttle_s": req.throttle_s, "level": req.level,
    }


class Reader:
    """Exact reads from a Stream, with a deadline per read."""

    def __init__(self, stream: Stream, timeout: float | None) -> None:
        self.stream, self.timeout, self.buf = stream, timeout, bytearray()

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.stream.recv(max(n - len(self.buf), 1 << 16), self.timeout)
            if not chunk:
                raise EOFError("the stream ended early")
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def until(self, marker: bytes, limit: int = 1 << 16) -> bytes:
        while marker not in self.buf:
            if len(self.buf) > limit + len(marker):
                raise EOFError(f"no {marker!r} within {limit} bytes")
            chunk = self.stream.recv(1 << 16, self.timeout)
            if not chunk:
                raise EOFError("the stream ended early")
            self.buf += chunk
        head, _, rest = bytes(self.buf).partition(marker)
        self.buf = bytearray(rest)
        return head


def _why(stream: Stream, exc: BaseException) -> str:
    tail = stream.stderr_tail().strip()
    return f"{type(exc).__name__}: {exc}" + (f" ({tail})" if tail else "")


def source_params(src: SourceListing, plan: HostPlan, req: OverlayRequest) -> dict[str, Any]:
    """What the source's stream_main reads: the files to send, in the order the target writes them."""
    return {"send": send_order(src, plan), "target_prefix": req.target_venv, "level": req.level}


def open_targets(members: list[HostContext], src: SourceListing, plans: Mapping[str, HostPlan],
                 req: OverlayRequest, direct_from: HostContext | None = None,
                 opened: Mapping[str, Opened] | None = None) -> tuple[dict[str, Stream], dict[str, Applied | str]]:
    sinks: dict[str, Stream] = {}
    failed: dict[str, Applied | str] = {}
    for ctx in members:
        try:
            params = {**target_params(src, plans[ctx.name], req), **target_dirs(ctx)}
            if direct_from is not None:  # the target runs the source's stream command itself
                command = stream_command("overlay_source", python_of(req.venv))
                params["direct"] = {"argv": direct_argv(direct_from, ctx, command),
                                    "params": source_params(src, plans[ctx.name], req)}
            stream = open_stream(opened, ctx, "overlay_target", python_of(req.target_venv))
            stream.send(frame(params))
            sinks[ctx.name] = stream
        except HostError as exc:
            failed[ctx.name] = f"cannot start the overlay: {exc.reason}"
        except Exception as exc:  # one target that cannot be reached must not stop the others
            failed[ctx.name] = f"cannot start the overlay: {type(exc).__name__}: {exc}"
    return sinks, failed


def pump(source: Stream, sinks: dict[str, Stream], failed: dict[str, Applied | str], timeout: float | None) -> None:
    """Forward the source's frames to every live target; a target that drops is marked and left."""
    reader = Reader(source, timeout)
    reader.until(STREAM_MAGIC)
    while sinks:
        size = struct.unpack(">I", reader.exact(4))[0]
        if size == 0:
            return
        chunk = reader.exact(size)
        for host, sink in list(sinks.items()):
            try:
                sink.send(chunk)
            except Exception as exc:
                failed[host] = send_failed(sink, exc)
                sink.close()
                del sinks[host]


class Lost(str):
    """An outcome: the target's SSH connection went away (the host is unreachable)."""


def _lost(sink: Stream) -> bool:
    check = getattr(sink, "connection_lost", None)
    return bool(check is not None and check())


def send_failed(sink: Stream, exc: BaseException) -> Applied | str:
    """A target stopped taking the stream: its own answer when it gave one (it failed and said why,
    e.g. its disk is full), else the lost connection."""
    if _lost(sink):
        return Lost(f"connection lost during the transfer: {_why(sink, exc)}")
    answer = collect(sink, 10.0)
    if isinstance(answer, str) and answer.startswith("no answer from the target"):
        return f"connection lost during the transfer: {_why(sink, exc)}"
    return answer


def collect(sink: Stream, timeout: float | None, host: str = "", direct_from: str | None = None) -> Applied | str:
    reader = Reader(sink, timeout)
    try:
        reader.until(BEGIN, limit=1 << 20)
        answer = json.loads(reader.until(END))
    except Exception as exc:
        if _lost(sink):
            return Lost(f"connection lost during the transfer: {_why(sink, exc)}")
        return f"no answer from the target: {_why(sink, exc)}"
    if not answer.get("ok"):
        if direct_from is not None and answer.get("unreachable"):
            return direct_failure(host, direct_from, answer["unreachable"])
        if answer.get("not_permitted"):  # refused before any change: the host's one line
            return str(answer.get("error"))
        return f"overlay failed on the target: {answer.get('error')}"
    r = answer["result"]
    return Applied(r["written"], r["removed"], r["bytes_in"], r["seconds"], r["manifest"],
                   "direct" if direct_from is not None else "controller")


def stream_group(source: HostContext, members: list[HostContext], src: SourceListing,
                 plans: Mapping[str, HostPlan], req: OverlayRequest,
                 opened: Mapping[str, Opened] | None = None) -> dict[str, Applied | str]:
    """One source stream, forwarded to every target of the group; each target's outcome. With
    ``--direct`` each target pulls its own stream from the source, all at once."""
    timeout = source.settings.command_timeout
    if req.direct:
        sinks, outcomes = open_targets(members, src, plans, req, direct_from=source, opened=opened)
        for host, sink in sinks.items():
            outcomes[host] = collect(sink, timeout, host, source.name)
            sink.close()
        return outcomes
    sinks, outcomes = open_targets(members, src, plans, req, opened=opened)
    if not sinks:
        return outcomes
    pipe: Stream | None = None
    try:
        pipe = open_stream(opened, source, "overlay_source", python_of(req.venv))
        pipe.send(frame(source_params(src, plans[next(iter(sinks))], req)))
        pump(pipe, sinks, outcomes, timeout)
    except Exception as exc:  # the source failed: no target may finish a partial stream
        why = _why(pipe, exc) if pipe is not None else f"{type(exc).__name__}: {exc}"
        for host, sink in sinks.items():
            outcomes[host] = f"the source {source.name} failed during the transfer: {why}"
            sink.close()
        return outcomes
    finally:
        if pipe is not None:
            pipe.close()
    for host, sink in sinks.items():
        outcomes[host] = collect(sink, timeout)
        sink.close()
    return outcomes
