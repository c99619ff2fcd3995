"""`make bench`: fleetctl side by side with its peers on a lab fleet of real sshd hosts (issue 9).

For each host count it starts its own lab (.fleetctl/bench-lab on 127.0.90.x), gives every host
/root/ml-env holding the real sglang 0.5.23 wheel's files, and times whole commands, the tools
of one job alternating within each round, after a warm-up round:

  ping               fleetctl ping | ssh HOST python3 - < scripts/ping.py (x2 kex) | ansible | pyinfra
                     (above 64 hosts: ping only, beside ssh with curve25519, with ControlPersist, and pyinfra)
  version inventory  fleetctl drift --venv V | the same with scripts/inventory.py under V's python
  source search      fleetctl probe grep ... --package sglang --subpath srt | scripts/search.py, every tool
                     with the host's grep cache (what an earlier search with these terms learnt)
  search_first       the same, every host's grep caches removed before each sample: every file read
  drift              fleetctl only: versions and --verify-files, first run (host caches cleared) and second
  release            fleetctl only, on the smallest lab: deploy of the example release, rollback

The peers (ansible-core, pyinfra) are installed by bench/peers.py into .cache/bench-peers/. Writes
bench/results.md and bench/results.json (--out STEM: STEM.md and STEM.json); takes the lab down at
the end, also on error.

    .venv/bin/python bench/run.py [--hosts 8,32,200] [--runs 5]
                                  [--jobs ping,inventory,search,search_first,drift,release] [--out STEM]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' wheel cache: sglang_support.wheel

import jobs  # noqa: E402
import peers  # noqa: E402
import report  # noqa: E402
from sglang_support import wheel as cached_wheel  # noqa: E402

from fleetctl.lab import LabFleet, LabPaths, lab_down, lab_up  # noqa: E402

LAB_DIR = ROOT / ".fleetctl" / "bench-lab"
# A second octet per checkout (as the tests' labs): two checkouts benchmarking at once never share addresses.
BASE = f"127.{100 + int(hashlib.sha256(str(ROOT).encode()).hexdigest(), 16) % 100}.90.0"
# Above this many hosts only ping runs, beside parallel OpenSSH (curve25519, and its ControlPersist
# masters for the kept-connection row) and pyinfra (issue 23): ansible-core and the OpenSSH default
# kex would take most of the bench's time there.
LARGE = 64
VENV = "/root/ml-env"
VENV_PY = f"{VENV}/bin/python"
SYS_PY = "/usr/bin/python3"
SGLANG = "0.5.23"
TERMS = ("update_mamba_state_after_mtp_verify", "disable_state_update", "mamba_intermediate", "Mamba")
# paramiko (fleetctl, pyinfra) and OpenSSH 9.2 agree on curve25519; OpenSSH alone picks sntrup761x25519.
SAME_KEX = ("-o", "KexAlgorithms=curve25519-sha256")
ALL_JOBS = ("ping", "inventory", "search", "search_first", "drift", "release")
RELEASE_SPEC = ROOT / "playbooks" / "releases" / "ddtree-sglang-0.5.23-lab.yml"
Job = Callable[[], float]


def host_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hosts wants N or N,M,...: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--hosts wants counts >= 1: {text!r}")
    return counts


# -- preparing the lab ---------------------------------------------------------------------------



def install_venvs(fleet: LabFleet) -> None:
    """lab1 gets /root/ml-env from pip (the real wheel, --no-deps); the others a hard-linked copy of
    it in their private /root (the same files, installed in a fraction of the time)."""
    paths = LabPaths(fleet.directory)
    marker = f"{VENV}/.bench-sglang-{SGLANG}"
    first = paths.host_dir(fleet.hosts[0].name) / "root" / "ml-env"
    if not (first / f".bench-sglang-{SGLANG}").exists():
        wheel = cached_wheel("sglang", SGLANG)
        visible = fleet.directory / "wheels" / wheel.name  # the lab folder is readable from every host
        visible.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wheel, visible)
        q = shlex.quote(VENV)
        script = (f"set -e; rm -rf {q}; {SYS_PY} -m venv {q}; {q}/bin/python -m pip install -q --no-deps "
                  f"--no-index --no-compile --disable-pip-version-check {shlex.quote(str(visible))}; "
                  f"touch {shlex.quote(marker)}")
        proc = subprocess.run(jobs.ssh_argv(fleet.directory, fleet.hosts[0].address, script),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise jobs.BenchError(f"venv on lab1: {proc.stderr[-2000:]}")
    for host in fleet.hosts[1:]:
        target = paths.host_dir(host.name) / "root" / "ml-env"
        if not (target / f".bench-sglang-{SGLANG}").exists():
            shutil.rmtree(target, ignore_errors=True)
            subprocess.run(["cp", "-al", str(first), str(target)], check=True)


def build_scripts(dest: Path) -> dict[str, Path]:
    """The shared script of each job: bench/scripts/ping.py, and fleetctl's own host-side modules
    (fleetctl/remote/*.py, verbatim, with their ``# fleetctl-include`` modules, as the agent ships
    them) with a tail that calls them as fleetctl's agent does."""
    from fleetctl.transport.agent import module_source

    dest.mkdir(parents=True, exist_ok=True)
    out = {"ping": dest / "ping.py", "inventory": dest / "inventory.py", "search": dest / "search.py"}
    shutil.copyfile(HERE / "scripts" / "ping.py", out["ping"])
    for job, module in (("inventory", "distributions"), ("search", "source")):
        out[job].write_text(module_source(module)[0] + "\n" + (HERE / "scripts" / f"{job}.py.tail").read_text())
    return out


def clear_host_caches(fleet: LabFleet) -> Callable[[], None]:
    """What makes a fleetctl run a first run: every host's /var/lib/fleetctl/cache (file hashes,
    compiled module code) removed, from this side, between samples."""
    paths = LabPaths(fleet.directory)
    folders = [paths.host_dir(h.name) / "var-lib-fleetctl" / "cache" for h in fleet.hosts]

    def clear() -> None:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)

    return clear


def clear_grep_caches(fleet: LabFleet) -> Callable[[], None]:
    """What makes a search a first search: every host's grep caches (grep-*.marshal in
    /var/lib/fleetctl/cache) removed, from this side, between samples."""
    paths = LabPaths(fleet.directory)
    folders = [paths.host_dir(h.name) / "var-lib-fleetctl" / "cache" for h in fleet.hosts]

    def clear() -> None:
        for folder in folders:
            for path in folder.glob("grep-*.marshal"):
                path.unlink(missing_ok=True)

    return clear


CGROUP = Path("/sys/fs/cgroup/cpuacct")


def host_cpu_meter(fleet: LabFleet) -> tuple[Callable[[], float] | None, Path | None]:
    """CPU seconds used so far by the lab hosts: every host's sshd is moved into one cpuacct cgroup
    of its own, which then counts everything the hosts run (sessions, interpreters, and processes
    that outlive their session and are reaped by init, which /proc's cutime would lose).
    (None, None) where cgroup v1 cpuacct is not writable: the column stays empty."""
    group = CGROUP / f"fleetctl-bench-{os.getpid()}"  # one per bench run: hosts kept from a smaller lab
    # stay in it with the sessions they already hold (ansible's ControlPersist ones)
    try:
        group.mkdir(exist_ok=True)
        for host in fleet.hosts:
            (group / "cgroup.procs").write_text(str(host.pid))
    except OSError as exc:
        print(f"bench: no host CPU column ({group}: {exc})", flush=True)
        return None, None
    usage = group / "cpuacct.usage"
    return (lambda: int(usage.read_text()) / 1e9), group


def remove_cgroups() -> None:
    """After lab_down: the bench's cgroups are empty (their sshd are gone); remove them."""
    for group in CGROUP.glob(f"fleetctl-bench-{os.getpid()}"):
        for _ in range(20):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)  # a last reaped process may still be leaving


# -- checks: a sample counts only when every host answered right -------------------------------

def json_summary(key: str, want: int, rc_ok: tuple[int, ...] = (0,)) -> Callable[[int, str], str | None]:
    def check(rc: int, out: str) -> str | None:
        if rc not in rc_ok:
            return f"exit {rc}"
        try:
            got = json.loads(out)["summary"][key]
        except (ValueError, KeyError, TypeError):
            return "no JSON summary"
        return None if got == want else f"summary.{key} = {got}, want {want}"

    return check


def ansible_answers(marker: str, want: int) -> Callable[[int, str], str | None]:
    """`ansible -o`: one `HOST | CHANGED => {json}` line per host, its stdout holding the marker."""
    def check(rc: int, out: str) -> str | None:
        if rc != 0:
            return f"exit {rc}"
        good = 0
        for line in out.splitlines():
            _, sep, doc = line.partition(" => ")
            if sep and doc.startswith("{") and marker in json.loads(doc).get("stdout", ""):
                good += 1
        return None if good == want else f"{good} hosts answered with {marker!r}, want {want}"

    return check


def pyinfra_answers(marker: str, want: int) -> Callable[[int, str], str | None]:
    """pyinfra exec: one `[HOST] OUTPUT` line per host, holding the marker (the command itself is
    echoed in pyinfra's results table, which is why only host-prefixed lines count)."""
    def check(rc: int, out: str) -> str | None:
        if rc != 0:
            return f"exit {rc}"
        hosts = {line.split("]", 1)[0] for line in out.splitlines() if line.startswith("[lab") and marker in line}
        return None if len(hosts) == want else f"{len(hosts)} hosts answered with {marker!r}, want {want}"

    return check


# -- one lab: every job ---------------------------------------------------------------------------

class Lab:
    def __init__(self, fleet: LabFleet) -> None:
        self.fleet = fleet
        self.count = len(fleet.hosts)
        self.inv = fleet.inventory_path
        self.addrs = [h.address for h in fleet.hosts]
        self.scripts = build_scripts(fleet.directory / "scripts")
        work = peers.PEERS / f"lab-{self.count}"
        self.ansible_env = peers.ansible_setup(fleet.directory, self.addrs, work / "ansible")
        self.ansible_dir = work / "ansible"
        self.pyinfra_inv = peers.pyinfra_setup(fleet.directory, self.addrs, work / "pyinfra")
        self.mux_dir = fleet.directory / "mux"
        # Short: a ControlPath (this folder + cm-%C + ssh's temporary suffix) must fit a Unix socket name.
        self.ssh_masters = Path("/tmp") / f"fleetctl-bench-cm-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}"

    def fleetctl(self, args: list[str], check: Callable[[int, str], str | None],
                 before: Callable[[], None] | None = None, persist: bool = False) -> Job:
        # -f: as many hosts in parallel as the lab has (the default, 32, is the same up to 32 hosts)
        argv = [str(jobs.FLEETCTL), "-i", str(self.inv), "-f", str(max(self.count, 32)), *args, "--json"]
        if not persist:
            return jobs.checked_job(argv, check, before=before)
        # Kept connections, as ansible's ControlPersist: the warm-up round opens them. The server's
        # CPU counts as the command's client CPU.
        env = {**os.environ, "FLEETCTL_MUX_DIR": str(self.mux_dir), "FLEETCTL_PERSIST": "300"}
        job = jobs.checked_job(argv, check, before=before, env=env)
        job.helper_cpu = jobs.pid_files_cpu(self.mux_dir)  # type: ignore[attr-defined]
        return job

    def stop_kept(self) -> None:
        from fleetctl.transport import mux

        mux.stop_server(mux.socket_path(self.mux_dir))
        jobs.stop_masters(self.ssh_masters)

    def peer_jobs(self, job: str, python: str, marker: str, expect: Callable[[int, str], bool],
                  before: Callable[[], None] | None = None) -> dict[str, Job]:
        script = self.scripts[job]
        return {
            "openssh": jobs.openssh_script_job(self.fleet.directory, self.addrs, python, script, expect,
                                               before=before),
            "openssh-x25519": jobs.openssh_script_job(self.fleet.directory, self.addrs, python, script, expect,
                                                      SAME_KEX, before=before),
            # The lower bound with kept connections: OpenSSH's own ControlPersist master per host.
            "openssh-persist": jobs.openssh_script_job(
                self.fleet.directory, self.addrs, python, script, expect,
                (*SAME_KEX, *jobs.persist_options(self.ssh_masters)), before=before),
            "ansible-core": jobs.checked_job(peers.ansible_argv(self.ansible_dir, script, python),
                                             ansible_answers(marker, self.count), env=self.ansible_env, before=before),
            "pyinfra": jobs.checked_job(peers.pyinfra_argv(self.pyinfra_inv, script, python, self.count),
                                        pyinfra_answers(marker, self.count), with_stderr=True, before=before),
        }

    def ping(self) -> dict[str, Job]:
        def expect(n: int, out: str) -> bool:
            return json.loads(out)["hostname"] == f"lab{n}"

        peers_ = self.peer_jobs("ping", SYS_PY, '"python_version": ', expect)
        if self.count > LARGE:
            peers_ = {k: v for k, v in peers_.items() if k in ("openssh-x25519", "openssh-persist", "pyinfra")}
        return {"fleetctl": self.fleetctl(["ping"], json_summary("ok", self.count)),
                "fleetctl-persist": self.fleetctl(["ping"], json_summary("ok", self.count), persist=True),
                **peers_}

    def inventory(self) -> dict[str, Job]:
        def expect(n: int, out: str) -> bool:
            return any(d["name"] == "sglang" and d["version"] == SGLANG for d in json.loads(out)["dists"])

        args = ["drift", "--venv", VENV, "--skip", "unsatisfied"]
        return {"fleetctl": self.fleetctl(args, json_summary("hosts", self.count)),
                "fleetctl-persist": self.fleetctl(args, json_summary("hosts", self.count), persist=True),
                **self.peer_jobs("inventory", VENV_PY, f'"dist_info": "sglang-{SGLANG}.dist-info"', expect)}

    def search(self, first_run: bool = False) -> dict[str, Job]:
        """Every tool runs source.py with the host's grep cache (fleetctl's default). ``first_run``:
        every host's grep caches removed before each sample, for every tool alike: each file read."""
        lines = self.expected_lines()
        clear = clear_grep_caches(self.fleet) if first_run else None

        def expect(n: int, out: str) -> bool:
            return int(json.loads(out)["matched_lines"]) == lines

        args = ["probe", "grep", *TERMS, "--package", "sglang", "--subpath", "srt", "--venv", VENV]
        return {"fleetctl": self.fleetctl(args, json_summary("ok", self.count), before=clear),
                "fleetctl-persist": self.fleetctl(args, json_summary("ok", self.count), before=clear, persist=True),
                **self.peer_jobs("search", VENV_PY, f'"matched_lines": {lines}', expect, before=clear)}

    def search_first(self) -> dict[str, Job]:
        return self.search(first_run=True)

    def expected_lines(self) -> int:
        argv = jobs.ssh_argv(self.fleet.directory, self.addrs[0], f"{VENV_PY} -")
        with self.scripts["search"].open("rb") as f:
            out = subprocess.run(argv, stdin=f, capture_output=True, check=True).stdout
        return int(json.loads(out)["matched_lines"])

    def drift(self) -> dict[str, Job]:
        clear = clear_host_caches(self.fleet)
        base = ["drift", "--venv", VENV, "--skip", "unsatisfied"]
        verify = [*base, "--verify-files"]
        ok = json_summary("hosts", self.count)
        return {"drift, first run": self.fleetctl(base, ok, before=clear),
                "drift, second run": self.fleetctl(base, ok),
                "drift --verify-files, first run": self.fleetctl(verify, ok, before=clear),
                "drift --verify-files, second run": self.fleetctl(verify, ok),
                "drift --verify-files --persist, first run": self.fleetctl(verify, ok, before=clear, persist=True),
                "drift --verify-files --persist, second run": self.fleetctl(verify, ok, persist=True)}

    def release(self, runs: int) -> dict[str, list[float]]:
        """Deploy the example (DDTree) release, fresh every run (a new version each time, so a real
        build, switch, restart and health gate), then roll back to the previous one, alternating."""
        ok = json_summary("ok", self.count)
        text = RELEASE_SPEC.read_text().replace("../files/", f"{RELEASE_SPEC.parent.parent}/files/")
        specs = self.fleet.directory / "specs"
        specs.mkdir(exist_ok=True)
        samples: dict[str, list[float]] = {f"deploy, {self.count} hosts": [], f"rollback, {self.count} hosts": []}
        for i in range(1 + runs):
            spec = specs / f"ddtree-bench-{i}.yml"
            spec.write_text(text.replace("version: 0.5.23-ddtree.1", f"version: 0.5.23-ddtree.bench{i}"))
            deploy = self.fleetctl(["-l", "all", "deploy", str(spec)], ok)()
            rollback = self.fleetctl(["-l", "all", "rollback"], ok)() if i else 0.0
            print(f"  release round {i}: deploy {deploy:.2f}s rollback {rollback:.2f}s", flush=True)
            if i:  # round 0 (no earlier release to roll back to) is the warm-up
                samples[f"deploy, {self.count} hosts"].append(deploy)
                samples[f"rollback, {self.count} hosts"].append(rollback)
        return samples


def measure(count: int, runs: int, wanted: list[str], release: bool, cpu: dict[str, dict[str, list[float]]],
            host_cpu: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, list[float]]]:
    started = time.monotonic()
    fleet = lab_up(count, LAB_DIR, BASE)
    print(f"lab: {count} hosts up in {fleet.elapsed_s:.1f}s", flush=True)
    if count > LARGE:
        wanted = [j for j in wanted if j == "ping"]
    if set(wanted) & {"inventory", "search", "search_first", "drift", "release"}:
        install_venvs(fleet)
    print(f"lab: venvs ready after {time.monotonic() - started:.1f}s", flush=True)
    lab = Lab(fleet)
    meter, _group = host_cpu_meter(fleet)
    out: dict[str, dict[str, list[float]]] = {}
    try:
        measure_jobs(lab, wanted, runs, release, out, cpu, host_cpu, meter)
    finally:
        lab.stop_kept()
    return out


load_at: dict[str, tuple[float, float, float]] = {}  # "HOSTS JOB" -> load average as the job started


def measure_jobs(lab: Lab, wanted: list[str], runs: int, release: bool, out: dict[str, dict[str, list[float]]],
                 cpu: dict[str, dict[str, list[float]]], host_cpu: dict[str, dict[str, list[float]]],
                 meter: Callable[[], float] | None) -> None:
    for job in wanted:
        if job == "release":
            if release:
                out["release (fleetctl)"] = lab.release(runs)
            continue
        t0 = time.monotonic()
        load_at[f"{lab.count} {job}"] = os.getloadavg()  # beside each measurement: the machine is shared
        tools = getattr(lab, job)()
        name = {"drift": "drift (fleetctl)", "inventory": "version inventory", "search": "source search",
                "search_first": "source search, first run"}.get(job, job)
        out[name] = jobs.rounds(tools, runs, cpu=cpu.setdefault(name, {}), host_cpu=meter,
                                hosts=host_cpu.setdefault(name, {}))
        print(f"  {name}: {time.monotonic() - t0:.1f}s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=host_counts, default=[8, 32, 200], help="host counts (default 8,32,200)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per command after 1 warm-up (>= 5)")
    ap.add_argument("--jobs", default=",".join(ALL_JOBS), help=f"which jobs (default {','.join(ALL_JOBS)})")
    ap.add_argument("--out", type=Path, default=HERE / "results", metavar="STEM",
                    help="write STEM.md and STEM.json (default bench/results)")
    ap.add_argument("--quick", action="store_true", help="allow --runs below 5 (harness debugging only)")
    args = ap.parse_args(argv)
    if args.runs < 5 and not args.quick:
        ap.error("--runs must be at least 5 (--quick to debug the harness)")
    wanted = [j for j in args.jobs.split(",") if j]
    if set(wanted) - set(ALL_JOBS):
        ap.error(f"--jobs: unknown {sorted(set(wanted) - set(ALL_JOBS))}")
    jobs.compile_fleetctl()
    given = sys.argv[1:] if argv is None else argv
    command = ".venv/bin/python bench/run.py " + shlex.join(given) if given else "make bench"
    doc: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": report.machine(), "command": command,
        "runs": args.runs, "warmup": 1, "load_before": os.getloadavg(), "fleet": {},
        "peers": peers.ensure_all(), "terms": list(TERMS), "sglang": SGLANG,
    }
    started = time.monotonic()
    counts = sorted(set(args.hosts))
    try:
        for count in counts:
            cpu = doc.setdefault("client_cpu_s", {}).setdefault(str(count), {})
            on_hosts = doc.setdefault("host_cpu_s", {}).setdefault(str(count), {})
            doc["fleet"][str(count)] = measure(count, args.runs, wanted, count == counts[0], cpu, on_hosts)
            doc.setdefault("load_during", {})[str(count)] = os.getloadavg()
    finally:
        lab_down(LAB_DIR, purge=True)
        remove_cgroups()
    doc["load_at"] = load_at
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    doc["load_after"] = os.getloadavg()
    stem = args.out.with_suffix("") if args.out.suffix in (".md", ".json") else args.out
    print(report.write(doc, stem))
    print(f"(took {doc['elapsed_s']}s; wrote {stem.with_suffix('.md')} and {stem.with_suffix('.json')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
