"""Checks shared by the reliability tests: is a host's whole state sound after a fault (its release
whole, no temporary or partial folder, state.json parsing and agreeing with ``current``, the service
serving ``current``, the deploy lock free), did the injected fault really happen, and polling with a
deadline that fails with what it saw."""

from __future__ import annotations

import json
import re
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from lab_support import LabHandle
from service_cleanup import stop_services, unmount

# On the host: what `current` names, whether that release is whole (every patched/added file
# matches the manifest's sha256, every file of the base venv is in the release's venv), and what
# temporary files are left.
_CHECK = textwrap.dedent("""\
    import hashlib, json, os, sys
    import fcntl
    root, base, state_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    out = {"current": None, "bad": [], "missing": [], "temps": [], "env_mode": None, "state": None,
           "state_error": None, "lock_held": False, "holder_left": False, "service_pid": None}
    rels = os.path.join(root, "releases")
    out["temps"] = sorted(n for n in (os.listdir(rels) if os.path.isdir(rels) else []) if n.startswith("."))
    out["temps"] += sorted(n for n in (os.listdir(root) if os.path.isdir(root) else []) if ".tmp-" in n)
    # the state folder: no temporary file of an interrupted write, state.json parses, the lock is free
    for top, dirs, files in os.walk(state_dir):
        dirs[:] = [d for d in dirs if d != "cache"]
        out["temps"] += sorted(os.path.relpath(os.path.join(top, n), state_dir) for n in files
                              if ".tmp-" in n or n.endswith(".fleetctl-tmp"))
    try:
        with open(os.path.join(state_dir, "state.json")) as handle:
            out["state"] = json.load(handle)
    except FileNotFoundError:
        pass
    except ValueError as exc:
        out["state_error"] = "state.json does not parse: %s" % exc
    lock = os.path.join(state_dir, "deploy.lock")
    if os.path.exists(lock):
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            out["lock_held"] = True
        os.close(fd)
    out["holder_left"] = os.path.exists(lock + ".holder")
    try:
        pid, _, marker = open(os.path.join(state_dir, "service", "sglang.pid")).read().partition("\\n")
        marker = marker.split("\\n")[0]  # the command; a "starttime N" line follows it
        stat = open("/proc/%d/stat" % int(pid)).read().rsplit(")", 1)[1].split()[0]
        if stat not in ("Z", "X") and marker.strip().encode() in open("/proc/%d/cmdline" % int(pid), "rb").read():
            out["service_pid"] = int(pid)
    except (OSError, ValueError):
        pass
    try:
        rel = os.path.join(root, os.readlink(os.path.join(root, "current")))
    except OSError:
        print(json.dumps(out)); sys.exit(0)
    out["current"] = os.path.basename(rel.rstrip("/"))
    try:
        manifest = json.load(open(os.path.join(rel, "manifest.json")))
    except (OSError, ValueError) as exc:
        out["bad"].append("manifest.json: %s" % exc); print(json.dumps(out)); sys.exit(0)
    base = base or manifest.get("base_venv") or ""
    for name, digest in manifest.get("venv_files", {}).items():
        path = os.path.join(rel, "venv", name)
        if not os.path.isfile(path) or hashlib.sha256(open(path, "rb").read()).hexdigest() != digest:
            out["bad"].append(name)
    for name, digest in (manifest.get("kernel_files") or {}).items():
        path = os.path.join(rel, name)
        if not os.path.isfile(path) or hashlib.sha256(open(path, "rb").read()).hexdigest() != digest:
            out["bad"].append(name)
    for top, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            name = os.path.relpath(os.path.join(top, f), base)
            if not os.path.lexists(os.path.join(rel, "venv", name)):
                out["missing"].append(name)
    out["env_mode"] = oct(os.stat(os.path.join(rel, "service.env")).st_mode & 0o777)
    print(json.dumps(out))
    """)


def release_state(lab: LabHandle, host: str, root: str = "/opt/fleetctl", base: str = "",
                  state_dir: str = "/var/lib/fleetctl") -> dict[str, Any]:
    """What the host holds (see _CHECK); ``base`` "" means the base venv its manifest names."""
    proc = lab.ssh(host, f"/usr/bin/python3 - {root} '{base}' {state_dir} <<'PY'\n{_CHECK}PY")
    return json.loads(proc.stdout)


def assert_whole(lab: LabHandle, host: str, release_id: str | None, root: str = "/opt/fleetctl",
                 base: str = "", state_dir: str = "/var/lib/fleetctl", serving: bool | None = True,
                 port: int = 30000) -> dict[str, Any]:
    """The end of every fault test, per host: ``current`` names ``release_id`` (None: no release),
    which is whole (manifest hashes, every file of its base venv); no temporary or partial file
    under the release root or the state folder; state.json parses and names the same current
    release; the deploy lock (its flock) is free; and the service serves ``current``
    (``serving`` True: it must run; False: it must not; None: when it runs). Returns the state."""
    state = assert_state_sound(lab, host, root, base, state_dir)
    where = f"{host}: {state}"
    assert state["current"] == release_id, where
    assert state["bad"] == [] and state["missing"] == [], where
    if release_id is not None:
        assert state["env_mode"] == "0o600", where
        assert (state["state"] or {}).get("current") == release_id, f"{host}: half-switched: {where}"
    running = state["service_pid"] is not None
    if serving is not None:
        assert running is serving, f"{host}: service {'not ' if serving else ''}running: {where}"
    if running and release_id is not None:
        assert served_release(lab, host, port) == release_id, where
    return state


def assert_state_sound(lab: LabHandle, host: str, root: str = "/opt/fleetctl", base: str = "",
                       state_dir: str = "/var/lib/fleetctl") -> dict[str, Any]:
    """The part of assert_whole that holds on any host, whatever release it has (tests of venvs and
    locks): no temporary file under the release root or the state folder, state.json parses and
    agrees with ``current``, the deploy lock free. Returns the state."""
    state = release_state(lab, host, root, base, state_dir)
    where = f"{host}: {state}"
    assert state["temps"] == [] and state["state_error"] is None, where
    if state["state"] is not None or state["current"] is not None:
        assert (state["state"] or {}).get("current") == state["current"], f"{host}: half-switched: {where}"
    # (a killed run's agent leaves its holder record behind, harmlessly: the flock is what locks)
    assert not state["lock_held"], f"{host}: deploy lock still held: {where}"
    return state


def fault_happened(evidence: object, what: str) -> None:
    """Fail loudly when the fault a test injected did not happen (the test would prove nothing)."""
    if not evidence:
        raise AssertionError(f"the injected fault did not happen: {what} (saw {evidence!r})")


T = TypeVar("T")


def wait_until(probe: Callable[[], T], what: str, timeout: float = 60, interval: float = 0.1,
               alive: Callable[[], object] | None = None) -> T:
    """Poll ``probe`` until it returns something true; past ``timeout`` (or once ``alive`` raises or
    says a process is gone) fail with ``what`` and the last thing probe saw."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        if alive is not None:
            alive()
        seen = probe()
        if seen:
            return seen
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:g}s (last seen: {seen!r})")


# How late a timeout may end and still count as honoured, on a shared and busy 2-core machine. The
# tests configure timeouts of a few seconds, so a default used in their place (10 s, 120 s), a
# timeout applied once per request, or a retry after it, ends well past timeout + slack.
TIMEOUT_SLACK = 5.0
# A request reaches the server a moment after the client's clock for it started.
ARRIVAL_LAG = 0.5
# A test that sees a command start on a host by polling the host's processes sees it up to this long
# after fleetctl's clock for its -T started (the channel opened, the shell started, the poll came round).
SEEN_LAG = 2.0


def assert_timeout_honoured(waited: float, timeout: float, what: str, lag: float = 0.0) -> None:
    """``waited`` (measured outside fleetctl) is ``timeout``: not cut short (more than ``lag``
    under it: what the measurement cannot see), not late (past TIMEOUT_SLACK over it)."""
    assert timeout - lag <= waited <= timeout + TIMEOUT_SLACK, \
        f"{what}: took {waited:.2f}s for a {timeout:g}s timeout " \
        f"(allowed {timeout - lag:g}..{timeout + TIMEOUT_SLACK:g}s)"


def hung_requests(lab: LabHandle, host: str, since: int, log: str = "/var/lib/fleetctl/service/sglang.log"
                  ) -> list[tuple[str, float, float]]:
    """(path, arrived, waited) of each request the stand-in hung (``--standin-hang PATH``) since byte
    ``since`` of its log: when it arrived (time.monotonic(), the machine's clock) and how long the
    caller waited before it closed the connection, as the stand-in saw it."""
    text = lab.ssh(host, f"tail -c +{since + 1} {log}").stdout
    return [(m[1], float(m[2]), float(m[3])) for m in
            re.finditer(r"fake_sglang: hung (\S+): arrived at ([\d.]+), closed by the client after ([\d.]+)s", text)]


def log_size(lab: LabHandle, host: str, log: str = "/var/lib/fleetctl/service/sglang.log") -> int:
    return int(lab.ssh(host, f"stat -c %s {log} 2>/dev/null || echo 0").stdout.split()[0])


def served_release(lab: LabHandle, host: str, port: int = 30000) -> str:
    out = lab.ssh(host, f"/usr/bin/python3 -c \"import urllib.request as u; print(u.urlopen("
                        f"'http://{lab.addresses[host]}:{port}/server_info', timeout=5).read().decode())\"")
    return str(json.loads(out.stdout)["fleetctl_standin"]["release"])


def write_spec(folder: Path, name: str, body: str, base: str = "/root/ml-env", sglang: bool = True) -> Path:
    """A lab release spec over ``base`` (sglang 0.5.23 unless ``sglang`` is False), served by the stand-in."""
    path = folder / f"{name}.yml"
    requires = 'requires: {sglang: "==0.5.23"}\n' if sglang else ""
    path.write_text(f"name: {name}\nversion: \"1\"\nbase: {{adopt: {base}}}\n{requires}" + textwrap.dedent(body))
    return path


# A base venv of the host's own python without pip: releases of it build in about a second, and the
# stand-in (stdlib only) serves them. For fault tests that need releases, not sglang.
TINY_BASE = "/root/tiny-env"
STANDIN_BODY = "service: {standin: true}\nhealth: {timeout: 30, interval: 0.2}\n"


def tiny_releases(lab: LabHandle, folder: Path, names: list[str], body: str = STANDIN_BODY) -> list[Path]:
    """Specs ``names`` over TINY_BASE, which is (re)made on every host of ``lab``."""
    for host in lab.hosts:
        lab.ssh(host, f"rm -rf {TINY_BASE} && /usr/bin/python3 -m venv --without-pip {TINY_BASE}")
    return [write_spec(folder, name, body, base=TINY_BASE, sglang=False) for name in names]


STATE = "/var/lib/fleetctl"


def fill_state_dir(lab: LabHandle, host: str, pages_left: int) -> None:
    """A 1 MB tmpfs over the host's state folder (in its own mount namespace), holding a copy of what
    was there, filled up to ``pages_left`` free pages."""
    lab.ssh(host, f"cp -a {STATE} /root/state-copy && mount -t tmpfs -o size=1m fleetctl-state-full {STATE} && "
                  f"cp -a /root/state-copy/. {STATE}/ && rm -rf /root/state-copy && "
                  f"dd if=/dev/zero of={STATE}/filler bs=4k 2>/dev/null "
                  f"count=$(( $(stat -f -c %a {STATE}) - {pages_left} ))")
    fault_happened(lab.ssh(host, f"stat -f -c %a {STATE}").stdout.strip() == str(pages_left),
                   f"{STATE} on {host} left with {pages_left} free pages")


def unmount_state_dir(lab: LabHandle, host: str) -> None:
    """Back to the host's own state folder: the service started on the tmpfs keeps its log open there,
    so its supervisor, then the server, are stopped first (the test's own clean-up, by their pidfiles)."""
    lab.ssh(host, f"{stop_services(STATE)}; {unmount(STATE)}", check=False)
    assert lab.ssh(host, f"findmnt -n -t tmpfs {STATE}; true").stdout.strip() == ""


def journal_events(path: Path) -> list[dict[str, object]]:
    """A run journal's events (a line cut short by a killed controller is left out)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def slow_rollout(lab: LabHandle, folder: Path, start_delay: int, timeout: int) -> tuple[Path, Path, Path]:
    """Release v1 (tiny), release v2 whose server answers /health only ``start_delay`` s after it starts,
    and a playbook rolling v2 out one host at a time (``on_failure: rollback_all``): (v1, v2, playbook)."""
    (first,) = tiny_releases(lab, folder, ["v1"])
    second = folder / "v2.yml"
    slow = (f'service:\n  standin: true\n  args: [--standin-start-delay, "{start_delay}"]\n'
            f"health: {{timeout: {timeout}, interval: 0.2}}\n")
    second.write_text(first.read_text().replace("name: v1", "name: v2").split("service:")[0] + slow)
    book = folder / "rollout.yml"
    book.write_text(yaml.safe_dump([{"name": "rollout", "hosts": "lab", "serial": 1, "on_failure": "rollback_all",
                                     "tasks": [{"name": "deploy", "release": str(second)}]}]))
    return first, second, book
