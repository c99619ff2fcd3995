"""Soak and capacity: what a rollout of hosts that serve traffic checks between its batches.

- **Soak re-check** (``recheck_after_pause``, on by default in a play with a ``release`` task): after a
  batch and its ``pause_between_batches``, the release's health gates are checked again on the
  batch's hosts that passed (``/health``, the probes, the thresholds; not the warm-up or the canary,
  which measure a fresh start). A server that died during the soak fails its batch: it counts
  against the budgets and ``on_failure`` applies, before the next batch starts. The last batch
  soaks too (its pause, then the re-check) before the play ends.
- **min_healthy** (a count or a percentage of the play's hosts, rounded up): before each batch, the
  play's hosts are asked whether they serve (``/health`` answers 200); hosts already down count as
  not serving. When the hosts left serving, less the batch's own, would fall below the floor, the
  rollout stops before touching the batch's first host.
- **progress_deadline** (seconds from the play's start): a task still running when it passes is
  ended (the connection of each host still on it is closed) and the rollout halts, naming the batch,
  the task and the hosts. Each such host gets a new session, so ``on_failure`` still rolls it back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, TypeVar

from fleetctl.release.gates import GateResult, run_gates
from fleetctl.transport.base import HostResult
from fleetctl.transport.fleet import Fleet, HostContext, make_connector

if TYPE_CHECKING:
    from fleetctl.playbook.play_schema import Play
    from fleetctl.playbook.schema import Task
    from fleetctl.playbook.state import Rollout
    from fleetctl.playbook.state import RunnerView as Runner
    from fleetctl.release.spec import ReleaseSpec

T = TypeVar("T")


class DeadlineExceeded(Exception):
    """The play's progress_deadline passed while ``task`` ran on ``hosts``."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def floor(min_healthy: int | str | None, total: int) -> int:
    """How many of the play's ``total`` hosts must keep serving (pure)."""
    if min_healthy is None:
        return 0
    if isinstance(min_healthy, int):
        return min_healthy
    return math.ceil(total * float(min_healthy.rstrip("%")) / 100 - 1e-9)


def below_floor(need: int, serving: list[str], batch: list[str], spec: int | str | None, total: int) -> str | None:
    """Why the batch may not start (taking its serving hosts out would leave fewer than ``need``)."""
    left = [h for h in serving if h not in batch]
    if len(left) >= need:
        return None
    return (f"min_healthy {spec}: {len(serving)} of {total} host(s) serving, and this batch would leave "
            f"{len(left)} (needs {need})")


def map_until(fleet: Fleet, fn: Callable[[HostContext], T], names: list[str],
              deadline: float | None) -> tuple[dict[str, HostResult[T]], list[str]]:
    """``fleet.map`` that gives up at ``deadline`` (monotonic): the results, and the hosts still running
    (their connections closed, so what they ran ends)."""
    if deadline is None:
        return fleet.map(fn, names), []
    pool = ThreadPoolExecutor(max_workers=max(1, min(fleet.settings.forks, len(names))),
                              thread_name_prefix="fleetctl-host")
    futures = {pool.submit(lambda n: fleet.map(fn, [n])[n], name): name for name in names}
    done, _ = wait(futures, timeout=max(0.0, deadline - time.monotonic()))
    results = {futures[f]: f.result() for f in done}
    stuck = [n for n in names if n not in results]
    for name in stuck:
        ctx = fleet.contexts[name]
        ctx.unreachable = "progress_deadline exceeded: its connection was closed"
        try:
            ctx.connector.close()
        except Exception:  # best effort: the host is given up on either way
            pass
        # A new session (connected on first use), so that on_failure can still roll the host back.
        fresh = HostContext(ctx.host, make_connector(fleet.inventory, ctx.host, fleet.settings), fleet.settings)
        fresh.vars = ctx.vars
        fleet.contexts[name] = fresh
    pool.shutdown(wait=False)
    return {n: results[n] for n in names if n in results}, stuck


def run_hosts(runner: Runner, task: Task, fn: Callable[[HostContext], T],
              names: list[str]) -> tuple[dict[str, HostResult[T]], list[str]]:
    """A task on ``names`` under the play's deadline. A ``pause`` is not cut short and its time does
    not count (as an approval gate's): a wait asked for is not a stuck rollout."""
    if task.module.name != "pause" or runner.deadline is None:
        return map_until(runner.fleet, fn, names, runner.deadline)
    start = time.monotonic()
    try:
        return runner.fleet.map(fn, names), []
    finally:
        runner.deadline += time.monotonic() - start


def deadline_why(play: Play, batch: int, task: Task | None, stuck: list[str]) -> str:
    at = f" at task {task.name!r}" if task else ""
    still = f" (still running: {', '.join(stuck)})" if stuck else ""
    return f"progress_deadline {play.model.progress_deadline:g}s exceeded in batch {batch}{at}{still}"


# -- between batches -----------------------------------------------------------------------------

def between_batches(runner: Runner, ro: Rollout, b: int) -> None:
    """The pause (ended early by Ctrl-C or the deadline), then the soak re-check of batch ``b``."""
    play, model = ro.play, ro.play.model
    if model.pause_between_batches:
        left = None if runner.deadline is None else max(0.0, runner.deadline - time.monotonic())
        runner.wait(model.pause_between_batches if left is None else min(left, model.pause_between_batches))
        if runner.deadline is not None and time.monotonic() >= runner.deadline:
            runner.halt(ro, b - 1, deadline_why(play, b, None, []) + " (in the pause after it)")
    if runner.stopping or not (model.recheck_after_pause and deploys(play)) or runner.options.check:
        return
    passed = [h for h in ro.plan[b - 1] if h not in ro.failed]
    if not passed:
        return
    bad = recheck(runner, play, passed)
    runner.emit("soak", play=play.index, batch=b, hosts=passed, failed=bad)
    for host, why in bad.items():
        runner.recap[host]["failed"] += 1
        runner.results.setdefault(host, []).append({"play": play.index, "task": None, "name": "soak re-check",
                                                  "host": host, "status": "failed", "msg": why})
        runner.emit("host_done", play=play.index, host=host, status="failed")
    if bad:
        ro.failed += list(bad)
        runner.halt(ro, b - 1, f"soak re-check failed after batch {b}: " + "; ".join(
            f"{h}: {w}" for h, w in bad.items()))


def after_last_batch(runner: Runner, ro: Rollout) -> None:
    """The last batch soaks too (its pause, then the re-check) before the play is called done."""
    model = ro.play.model
    if ro.plan and not runner.stopping and model.recheck_after_pause and deploys(ro.play) and \
            not runner.options.check:
        between_batches(runner, ro, len(ro.plan))


def deploys(play: Play) -> bool:
    """The play switches hosts to a release (a play that only stages has nothing to re-check)."""
    return any(t.module.name == "release" and t.args.get("state", "deployed") == "deployed" for t in play.tasks)


def check_capacity(runner: Runner, ro: Rollout, b: int, hosts: list[str]) -> None:
    model = ro.play.model
    if model.min_healthy is None or runner.options.check:
        return
    need = floor(model.min_healthy, len(hosts))
    up = serving(runner, ro.play, hosts)
    batch = ro.plan[b]
    live = [h for h in hosts if up.get(h)]
    runner.emit("capacity", play=ro.play.index, batch=b + 1, serving=live,
                down=[h for h in hosts if not up.get(h)], min_healthy=model.min_healthy, need=need)
    why = below_floor(need, live, batch, model.min_healthy, len(hosts))
    if why:
        runner.halt(ro, b - 1, f"{why}: batch {b + 1} ({', '.join(batch)}) not started", before_batch=True)


# -- the release's health, asked of hosts ---------------------------------------------------------

def release_spec(runner: Runner, play: Play, host: str) -> ReleaseSpec | None:
    """The spec the play's (first) deploying release task names, rendered for ``host``."""
    from fleetctl import templating
    from fleetctl.playbook.modules.base import once
    from fleetctl.release.spec import load_spec

    task = next((t for t in play.tasks if t.module.name == "release" and t.args.get("state", "deployed")
                 in ("deployed", "staged")), None)
    if task is None:
        return None
    ctx = runner.fleet.contexts[host]
    raw = templating.render(task.args.get("spec"), runner.task_vars(ctx, [host]))
    path = (runner.playbook.path.parent / str(raw)).resolve()
    return once(runner.services, ("release-spec-only", str(path)), lambda: load_spec(path))


def serving(runner: Runner, play: Play, hosts: list[str]) -> dict[str, bool]:
    """Whether each host answers its release's /health with 200 now (one quick request)."""
    from fleetctl.probes.http import HttpRequest, probe_http
    from fleetctl.release.service import layout_for, listen

    def ask(ctx: HostContext) -> bool:
        spec = release_spec(runner, play, ctx.name)
        if spec is None:
            return True
        port = listen(spec, layout_for(ctx.vars))[1]
        return probe_http(ctx, HttpRequest(spec.model.health.path, port=port, timeout=5)).status == 200

    return {h: bool(r.ok and r.value) for h, r in runner.fleet.map(ask, names=hosts).items()}


def recheck(runner: Runner, play: Play, hosts: list[str]) -> dict[str, str]:
    """The soak re-check on ``hosts``: host -> why it failed (hosts that passed are left out)."""
    from fleetctl.release.service import layout_for, listen

    def again(ctx: HostContext) -> list[GateResult]:
        spec = release_spec(runner, play, ctx.name)
        if spec is None:
            return []
        health = spec.model.health.model_copy(update={"warmup": None, "canary": None,
                                                      "timeout": min(spec.model.health.timeout, 30.0)})
        layout = layout_for(ctx.vars)
        return run_gates(ctx, health, layout, listen(spec, layout)[1])

    out: dict[str, str] = {}
    for host, res in runner.fleet.map(runner.as_release(play, again), names=hosts).items():
        bad = next((g for g in res.value or [] if not g.ok), None) if res.ok else None
        if not res.ok:
            out[host] = f"soak re-check: {res.reason}"
        elif bad is not None:
            out[host] = f"soak re-check: {bad.name}: {bad.detail}"
    return out


def soak_event(host: str, why: str) -> dict[str, Any]:
    return {"host": host, "status": "failed", "msg": why}
