"""Cost curves (issue 37): each read-only job at 8, 32, 200 and 1,000 lab hosts, beside its peers.

One lab (.fleetctl/scale-lab, on 127.X.120.1 onwards: a lab past 254 hosts goes on into the next
/24s) grows size by size, smallest first (the hosts already up are kept); each size is measured on
an inventory of exactly its N hosts. Measured per job and tool, after a warm-up:

  wall time            the whole command, median of --runs
  controller CPU/host  user + system of the command's whole process tree (os.wait4), plus the
                       kept-connection server's CPU while it ran (kept rows), divided by N
  controller RSS/host  peak RSS of the largest process of the tree (+ the kept server's VmHWM),
                       divided by N; for the OpenSSH fan-out the sum of the N ssh processes' peaks
  hosts' CPU/host      CPU the lab hosts used (every sshd and what it started, in one cpuacct
                       cgroup, which also counts processes reaped by init), divided by N

Jobs: ping, facts, drift (version inventory: drift --venv V), probe grep (the source search with
the host's grep cache), gpu health (each host's fake nvidia-smi printing the real H200 capture of
tests/fixtures/nvidia-smi), report. Tools: fleetctl fresh, fleetctl kept (FLEETCTL_PERSIST; its
server stopped between jobs), and where the job has a shared script (ping, drift, probe grep):
OpenSSH with curve25519 (one ssh per host, all at once) and pyinfra at every size, ansible-core
2.19 and 2.21 up to 32 hosts. Writes bench/scale.md, bench/scale.json and bench/figures/*.png.

    .venv/bin/python bench/scale.py [--hosts 8,32,200,1000] [--runs 3] [--jobs ping,facts,...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))

import jobs  # noqa: E402
import peers  # noqa: E402
import report  # noqa: E402
import run  # noqa: E402
import scale_jobs as sj  # noqa: E402
import scale_report  # noqa: E402

from fleetctl.lab import LabFleet, LabPaths, lab_down, lab_up  # noqa: E402

LAB_DIR = ROOT / ".fleetctl" / "scale-lab"
TOOLS_APART_FROM = 1000  # hosts: from here tools do not alternate within a round (measure_size)
BASE = f"127.{100 + int(hashlib.sha256(str(ROOT).encode()).hexdigest(), 16) % 100}.120.0"
ALL_JOBS = ("ping", "facts", "drift", "probe_grep", "gpu_health", "report")
ANSIBLE_UP_TO = 32  # ansible-core takes minutes a sample past this; pyinfra and OpenSSH run at every size
SMI_DIR = "/root/fake-nvidia-smi"  # on each host (its /root is its own)
GPU_VARS = ["-e", f"nvidia_smi={SMI_DIR}/nvidia-smi", "-e", "gpus_expected=1", "-e", "gpu_model=H200"]


def host_counts(text: str) -> list[int]:
    return sorted(set(run.host_counts(text)))


# -- the lab -------------------------------------------------------------------------------------

def idle_memory(fleet: LabFleet) -> dict[str, Any]:
    """What an idle host costs: each host is one sshd listener in its own mount + UTS namespace.
    PSS (shared pages split among sharers) and RSS from smaps_rollup, per host, and their sum."""
    pss = rss = 0
    for host in fleet.hosts:
        for line in Path(f"/proc/{host.pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss += int(line.split()[1])
            elif line.startswith("Rss:"):
                rss += int(line.split()[1])
    n = len(fleet.hosts)
    return {"hosts": n, "pss_kib_per_host": round(pss / n, 1), "rss_kib_per_host": round(rss / n, 1),
            "pss_mib_total": round(pss / 1024, 1), "processes_per_host": 1, "open_files_per_host":
            len(os.listdir(f"/proc/{fleet.hosts[0].pid}/fd"))}


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemAvailable", "Slab", "SUnreclaim", "Shmem"):
            out[key] = int(rest.split()[0])
    return out


def install_fake_smi(fleet: LabFleet) -> None:
    """Every host's nvidia-smi prints the real H200 capture (`-q -x`), no NVLink, as the tests' fake."""
    from gpu_fixtures import H200_XML, fake_nvidia_smi

    paths = LabPaths(fleet.directory)
    for host in fleet.hosts:
        folder = paths.host_dir(host.name) / "root" / "fake-nvidia-smi"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "q.xml").write_text(H200_XML)
        (folder / "nvlink.txt").write_text("")
        smi = folder / "nvidia-smi"
        smi.write_text(fake_nvidia_smi(f"{SMI_DIR}/q.xml", f"{SMI_DIR}/nvlink.txt"))
        smi.chmod(0o755)


def sub_inventory(fleet: LabFleet, count: int) -> Path:
    """The lab's inventory cut to its first ``count`` hosts (the key path stays relative to its folder)."""
    doc = yaml.safe_load(fleet.inventory_path.read_text())
    hosts = doc["all"]["children"]["lab"]["hosts"]
    doc["all"]["children"]["lab"]["hosts"] = dict(list(hosts.items())[:count])
    path = fleet.directory / f"inventory-{count}.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# -- the tools of each job at one size ----------------------------------------------------------

class Size:
    """The first ``count`` hosts of the lab, and every tool's command for each job on them."""

    only: list[str] = []  # --tools
    timeout = 0.0  # --connect-timeout

    def __init__(self, fleet: LabFleet, count: int, scripts: dict[str, Path], lines: int) -> None:
        self.fleet, self.count, self.scripts, self.lines = fleet, count, scripts, lines
        self.addrs = [h.address for h in fleet.hosts[:count]]
        self.inv = sub_inventory(fleet, count)
        self.mux_dir = fleet.directory / "mux"
        work = peers.PEERS / f"scale-{count}"
        self.pyinfra_inv = peers.pyinfra_setup(fleet.directory, self.addrs, work / "pyinfra")
        self.ansible_dir = work / "ansible"
        self.ansible_env = (peers.ansible_setup(fleet.directory, self.addrs, self.ansible_dir)
                            if count <= ANSIBLE_UP_TO else None)

    def fleetctl(self, args: list[str], check: sj.Check) -> dict[str, sj.Tool]:
        extra = ["-e", f"ansible_timeout={self.timeout:g}"] if self.timeout else []
        argv = [str(jobs.FLEETCTL), "-i", str(self.inv), "-f", str(min(max(self.count, 32), 1024)), *extra, *args,
                "--json"]
        kept_env = {**os.environ, "FLEETCTL_MUX_DIR": str(self.mux_dir), "FLEETCTL_PERSIST": "600"}
        return {"fleetctl": sj.command(argv, check),
                "fleetctl kept": sj.command(argv, check, env=kept_env, server=sj.server_meter(self.mux_dir))}

    def stop_kept(self) -> None:
        from fleetctl.transport import mux

        mux.stop_server(mux.socket_path(self.mux_dir))

    def peers(self, script: str, python: str, marker: str, expect: Any) -> dict[str, sj.Tool]:
        path = self.scripts[script]
        argvs = [jobs.ssh_argv(self.fleet.directory, a, f"{shlex.quote(python)} -", run.SAME_KEX) for a in self.addrs]
        tools = {"openssh-x25519": sj.fan_out(argvs, path, expect),
                 "pyinfra": sj.command(peers.pyinfra_argv(self.pyinfra_inv, path, python, self.count),
                                       run.pyinfra_answers(marker, self.count), with_stderr=True)}
        if self.ansible_env is not None:
            for peer, label in (("ansible", "ansible-core 2.19"), ("ansible-2.21", "ansible-core 2.21")):
                tools[label] = sj.command(peers.ansible_argv(self.ansible_dir, path, python, peer),
                                          run.ansible_answers(marker, self.count), env=self.ansible_env)
        return tools

    def expected_lines(self) -> int:
        """What the search finds on lab1 (every host has the same files): the check of each answer."""
        argv = jobs.ssh_argv(self.fleet.directory, self.addrs[0], f"{run.VENV_PY} -")
        with self.scripts["search"].open("rb") as f:
            out = subprocess.run(argv, stdin=f, capture_output=True, check=True).stdout
        return int(json.loads(out)["matched_lines"])

    def ping(self) -> dict[str, sj.Tool]:
        def expect(n: int, out: str) -> bool:
            return json.loads(out)["hostname"] == f"lab{n}"

        return {**self.fleetctl(["ping"], run.json_summary("ok", self.count)),
                **self.peers("ping", run.SYS_PY, '"python_version": ', expect)}

    def facts(self) -> dict[str, sj.Tool]:
        return self.fleetctl(["facts"], run.json_summary("ok", self.count))

    def drift(self) -> dict[str, sj.Tool]:
        def expect(n: int, out: str) -> bool:
            return any(d["name"] == "sglang" and d["version"] == run.SGLANG for d in json.loads(out)["dists"])

        return {**self.fleetctl(["drift", "--venv", run.VENV, "--skip", "unsatisfied"],
                                run.json_summary("hosts", self.count)),
                **self.peers("inventory", run.VENV_PY, f'"dist_info": "sglang-{run.SGLANG}.dist-info"', expect)}

    def probe_grep(self) -> dict[str, sj.Tool]:
        def expect(n: int, out: str) -> bool:
            return int(json.loads(out)["matched_lines"]) == self.lines

        args = ["probe", "grep", *run.TERMS, "--package", "sglang", "--subpath", "srt", "--venv", run.VENV]
        return {**self.fleetctl(args, run.json_summary("ok", self.count)),
                **self.peers("search", run.VENV_PY, f'"matched_lines": {self.lines}', expect)}

    def gpu_health(self) -> dict[str, sj.Tool]:
        return self.fleetctl([*GPU_VARS, "gpu", "health"], run.json_summary("ok", self.count))

    def report(self) -> dict[str, sj.Tool]:
        return self.fleetctl([*GPU_VARS, "report", "--venv", run.VENV], run.json_summary("hosts", self.count))


# -- the whole curve -----------------------------------------------------------------------------

def grow(count: int) -> tuple[LabFleet, dict[str, Any]]:
    """The lab grown to ``count`` hosts (hosts already up are kept), each with the venv and the
    fake nvidia-smi; what starting them took and what an idle host costs."""
    before = meminfo()
    fleet = lab_up(count, LAB_DIR, BASE)
    time.sleep(2)  # the last hosts' start-up work done before the idle reading
    lab = {"up_s": round(fleet.elapsed_s, 1), "started": len(fleet.started), "base": BASE,
           "last_address": fleet.hosts[-1].address, **idle_memory(fleet), "meminfo_before_kib": before,
           "meminfo_after_kib": meminfo()}
    avail = before["MemAvailable"] - lab["meminfo_after_kib"]["MemAvailable"]
    lab["mem_available_drop_kib_per_started_host"] = round(avail / max(1, len(fleet.started)), 1)
    print(f"lab: {count} hosts ({len(fleet.started)} started) in {fleet.elapsed_s:.1f}s; idle host PSS "
          f"{lab['pss_kib_per_host']} KiB, RSS {lab['rss_kib_per_host']} KiB; MemAvailable fell "
          f"{avail / 1024:.0f} MiB", flush=True)
    started = time.monotonic()
    run.install_venvs(fleet)
    install_fake_smi(fleet)
    lab["venvs_s"] = round(time.monotonic() - started, 1)
    print(f"lab: venvs and fake nvidia-smi in {lab['venvs_s']}s", flush=True)
    return fleet, lab


def measure_size(size: Size, wanted: list[str], runs: int, meter: Any, doc: dict[str, Any]) -> None:
    for job in wanted:
        t0 = time.monotonic()
        load = os.getloadavg()
        tools = {k: v for k, v in getattr(size, job)().items() if not Size.only or k in Size.only}
        # At 1,000 the kept server's agents (two per host for drift: the system python's and the
        # venv's, 6.5 MiB each after a drift) and a fresh run's (an agent and a venv child per host) do
        # not fit in this machine's 23.5 GiB beside the lab: the kernel's OOM killer took the server (14:35).
        # There each tool runs its rounds alone, the server stopped after them.
        groups = [tools] if size.count < TOOLS_APART_FROM else [{k: v} for k, v in tools.items()]
        got: dict[str, Any] = {}
        for group in groups:
            try:
                got.update(sj.rounds(group, runs, meter))
            finally:
                size.stop_kept()
        entry = doc["results"].setdefault(job, {}).setdefault(str(size.count), {})
        stamp = {"load_before": [round(x, 2) for x in load], "load_after": [round(x, 2) for x in os.getloadavg()],
                 "runs": runs, "command": doc["command"]}
        measured = {name: {**vars(m), **stamp} for name, m in got.items()}
        if Size.only and "tools" in entry:  # --tools: these rows replaced, the job's other tools kept
            entry["tools"].update(measured)
        else:
            entry.update(stamp)
            entry["tools"] = measured
        took = time.monotonic() - t0
        print(f"  {size.count} hosts, {job}: {took:.1f}s "
              + ", ".join(f"{n} {report.med(m.wall_s):.2f}s" for n, m in got.items() if m.wall_s), flush=True)
        scale_report.save(doc)  # every job written as it ends: a run cut short keeps what it measured


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=host_counts, default=[8, 32, 200, 1000], help="host counts")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per tool after 1 warm-up")
    ap.add_argument("--large-runs", type=int, default=2, help="timed runs past 200 hosts (default 2)")
    ap.add_argument("--jobs", default=",".join(ALL_JOBS), help=f"which jobs (default {','.join(ALL_JOBS)})")
    ap.add_argument("--keep-lab", action="store_true", help="leave the lab up at the end (debugging)")
    ap.add_argument("--tools", default="", help="only these tools (comma-separated names as in the tables)")
    ap.add_argument("--connect-timeout", type=float, default=0.0,
                    help="fleetctl's connect timeout (-e ansible_timeout=S) at every size; 0: the default, 10 s")
    ap.add_argument("--merge", action="store_true",
                    help="add to bench/scale.json's results (these sizes and jobs replaced) instead of starting anew")
    args = ap.parse_args(argv)
    wanted = [j for j in args.jobs.split(",") if j]
    if set(wanted) - set(ALL_JOBS):
        ap.error(f"--jobs: unknown {sorted(set(wanted) - set(ALL_JOBS))}")
    jobs.compile_fleetctl()
    given = sys.argv[1:] if argv is None else argv
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": report.machine(),
        "command": ".venv/bin/python bench/scale.py " + shlex.join(given) if given else "make bench",
        "runs": args.runs, "large_runs": args.large_runs, "warmup": 1, "hosts": args.hosts,
        "load_before": os.getloadavg(),
        "peers": {**peers.ensure_all(), "ansible-2.21": peers.ensure("ansible-2.21")}, "results": {},
    }
    if args.merge and scale_report.STEM.with_suffix(".json").exists():
        old = json.loads(scale_report.STEM.with_suffix(".json").read_text())
        doc["results"], doc["lab"] = old.get("results", {}), old.get("lab", {})
        doc["merged"] = [*old.get("merged", [old["command"]]), doc["command"]]
    Size.only = [t for t in args.tools.split(",") if t]
    Size.timeout = args.connect_timeout
    started = time.monotonic()
    try:
        for count in args.hosts:
            fleet, lab = grow(count)
            doc.setdefault("lab", {}).setdefault(str(count), lab)
            scale_report.save(doc)
            meter, _group = run.host_cpu_meter(fleet)  # the new hosts join the cgroup
            scripts = run.build_scripts(fleet.directory / "scripts")
            size = Size(fleet, count, scripts, 0)
            size.lines = size.expected_lines()
            measure_size(size, wanted, args.runs if count <= 200 else args.large_runs, meter, doc)
    finally:
        if not args.keep_lab:
            lab_down(LAB_DIR, purge=True)
        run.remove_cgroups()
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    doc["load_after"] = os.getloadavg()
    print(scale_report.save(doc, figures=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
