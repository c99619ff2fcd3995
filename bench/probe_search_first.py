"""Part (c) of bench/probe_search.py: `probe grep`'s first run at 32 hosts beside ansible-core (issue 37).

bench/run.py's 32-host lab and its `source search, first run` job (every host's grep caches
removed before each sample; ansible-core runs the same source.py as a script), fleetctl and
ansible-core alone, alternating, with the client's and the lab hosts' CPU; beside them, the same
fleetctl command's fixed part (`ping`; a grep of one file) and the module's phases in-process, so
that the hosts' CPU of one search splits into connection, interpreter, file system and scan.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable

import jobs
import report
from sglang_support import wheel as cached_wheel

from fleetctl.lab import LabFleet, lab_down, lab_up

FIRST_RUN_HOSTS = 32
# fleetctl-persist: kept connections, as ansible-core's ControlPersist masters (opened by the warm-up);
# openssh-x25519: `ssh HOST PY - < search.py` per host, all at once, paramiko's key exchange: the
# lower bound of any tool on fresh connections that runs the search in a fresh interpreter
FIRST_RUN_TOOLS = ("fleetctl", "ansible-core", "fleetctl-persist", "openssh-x25519")
# Where one fresh session's CPU goes on a host (issue 37): plain OpenSSH sessions with paramiko's key
# exchange, each adding one step of fleetctl's agent start; keys are the rows' names.
SESSION_ROWS = ("ssh HOST true", "ssh HOST venv-python -c pass", "ssh HOST venv-python -c AGENT-START")
SECTION_C = "## (c) first run at 32 hosts beside ansible-core"
VERSION = "0.5.23"
VENV = "/root/ml-env"
TERMS = ("update_mamba_state_after_mtp_verify", "disable_state_update", "mamba_intermediate", "Mamba")
SAME_KEX = ("-o", "KexAlgorithms=curve25519-sha256")  # what paramiko negotiates
SYS_PY = "/usr/bin/python3"  # the python the lab hosts' venvs are made from


def first_run_samples(runs: int) -> dict:
    """(c): bench/run.py's 32-host lab and its `source search, first run` job, fleetctl and
    ansible-core alone, alternating; wall, client CPU and hosts' CPU per sample."""
    import run as bench_run  # bench/run.py: its lab, venvs, shared search script and checks

    bench_run.peers.ensure("ansible")
    fleet = lab_up(FIRST_RUN_HOSTS, bench_run.LAB_DIR, bench_run.BASE)
    lab = None
    try:
        bench_run.install_venvs(fleet)
        lab = bench_run.Lab(fleet)
        meter, _group = bench_run.host_cpu_meter(fleet)
        tools = {k: v for k, v in lab.search_first().items() if k in FIRST_RUN_TOOLS}
        # The same command's fixed part on the hosts: connect + agent (ping), + the venv's python
        # and the module (a grep of one 722-byte file); the first run less these is the search.
        ok = bench_run.json_summary("ok", FIRST_RUN_HOSTS)
        tools["fleetctl ping"] = lab.fleetctl(["ping"], ok)
        tools["fleetctl probe grep, one file"] = lab.fleetctl(
            ["probe", "grep", *TERMS, "--package", "sglang", "--subpath", "srt/constants.py", "--venv", VENV], ok)
        tools.update(session_jobs(fleet))
        cpu: dict[str, list[float]] = {}
        hosts: dict[str, list[float]] = {}
        wall = jobs.rounds(tools, runs, cpu=cpu, host_cpu=meter, hosts=hosts)
        phases = host_python_phases(max(runs, 5))  # the lab hosts are idle meanwhile
    finally:
        if lab is not None:
            lab.stop_kept()
        lab_down(bench_run.LAB_DIR)  # kept (not purged): the venvs take minutes to install again
        bench_run.remove_cgroups()
    return {"wall": wall, "client_cpu": cpu, "hosts_cpu": hosts, "phases": phases}


def session_jobs(fleet: LabFleet) -> dict[str, Callable[[], float]]:
    """SESSION_ROWS: an SSH session running ``true`` (sshd's connection, key exchange, login and the
    shell), then the venv's python doing nothing, then fleetctl's agent start code (its compiled code
    from the host's cache, as every fleetctl command after a host's first has it; named so that the
    agent does not serve: no request, no answer), all hosts at once."""
    import shlex

    from fleetctl.transport.agent import module_source
    from fleetctl.transport.agent_boot import start_code

    py = f"{VENV}/bin/python"
    start = start_code(*module_source("agent"), "fleetctl_bench_start")
    commands = ("true", f"{py} -c pass", f"{py} -c {shlex.quote(start)}")
    addrs = [h.address for h in fleet.hosts]
    return {row: jobs.openssh_job(fleet.directory, addrs, cmd, lambda n, out: out == "", SAME_KEX)
            for row, cmd in zip(SESSION_ROWS, commands, strict=True)}


def host_python_phases(runs: int) -> dict[str, float]:
    """module_phases run by the hosts' python (SYS_PY, the lab venvs' base): its bytes.find is not
    the bench's python's (a pyenv build scans short terms at half the speed)."""
    import json
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    code = f"import json, probe_search_first as p; print(json.dumps(p.module_phases({int(runs)})))"
    path = os.pathsep.join(str(p) for p in (here, here.parent / "tests", here.parent))
    out = subprocess.run([SYS_PY, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": path}).stdout
    return json.loads(out.strip().splitlines()[-1])


def module_phases(runs: int) -> dict[str, float]:
    """CPU ms of one host's first search, in-process on the unpacked wheel's sglang/srt (this
    machine, median of ``runs``): the phases source.main goes through, each alone."""
    from fleetctl.transport.agent import module_source

    src = module_source("source")[0]
    ns: dict = {"__name__": "bench_source"}
    exec(compile(src, "<source.py>", "exec"), ns)  # noqa: S102 - our own module, as the agent runs it
    with tempfile.TemporaryDirectory(prefix="fleetctl-bench-site-") as tmp:
        with zipfile.ZipFile(cached_wheel("sglang", VERSION)) as zf:
            zf.extractall(tmp, [n for n in zf.namelist() if n.startswith("sglang/")])
        sys.path.insert(0, tmp)
        try:
            return phase_medians(ns, tmp, runs)
        finally:
            sys.path.remove(tmp)


PHASE_SCAN = ("scan for the terms (guarded)", "the matching files' lines (every match, its line number)")
PHASE_OURS = ("per-file Python around them, the answer", "grep cache: fstat identities, learn, write")


def phase_medians(ns: dict, site: str, runs: int) -> dict[str, float]:
    base, terms = f"{site}/sglang/srt", list(TERMS)
    finders, kind = ns["compile_terms"](terms, False, False)
    needles, groups = ns["fixed_needles"](terms, False, kind)
    singles = [(None, [i]) for i in range(len(needles))]
    params = {"mode": "grep", "package": "sglang", "subpath": "srt", "terms": terms, "workers": 1}
    cache = f"{site}/cache"

    def read_all(scan_groups: list | None, lines: bool = False) -> None:
        budget = 200
        for path in sorted(ns["list_files"](base)):
            data = ns["read_text_bytes"](path)
            if data and scan_groups is not None:
                firsts = ns["first_matches"](data, needles, scan_groups)
                if lines and max(firsts) >= 0:
                    budget -= len(ns["grep_file"](data, terms, finders, kind, budget, 0, firsts)["hits"])

    def first_run() -> None:
        shutil.rmtree(cache, ignore_errors=True)
        ns["main"]({**params, "cache_dir": cache})

    steps = {"list": lambda: sorted(ns["list_files"](base)), "read": lambda: read_all(None),
             "scan": lambda: read_all(groups), "lines": lambda: read_all(groups, True),
             "scan, a pass per term": lambda: read_all(singles),
             "main": lambda: ns["main"](dict(params)), "main + cache": first_run}
    took: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(runs):
        for name, step in steps.items():
            t0 = time.process_time()
            step()
            took[name].append((time.process_time() - t0) * 1000)
    m = {k: report.med(v) for k, v in took.items()}
    return {"list the tree (scandir)": m["list"], "open, read, close 2,602 files": m["read"] - m["list"],
            PHASE_SCAN[0]: m["scan"] - m["read"],
            "(scan, one pass per term: before)": m["scan, a pass per term"] - m["read"],
            PHASE_SCAN[1]: m["lines"] - m["scan"], PHASE_OURS[0]: m["main"] - m["lines"],
            PHASE_OURS[1]: m["main + cache"] - m["main"], "the whole first search": m["main + cache"]}


def markdown_c(doc: dict, c: dict) -> str:
    """The (c) section: medians, the ratio, and the CPU floor (client + hosts CPU) / CPUs."""
    cpus = doc["machine"]["cpus"]
    base = report.med(c["wall"]["fleetctl"])
    lines = [
        SECTION_C, "",
        f"- date: {doc['date']}; reproduce: `{doc['command']}` (took {doc['elapsed_s']}s); load average (1 min) "
        f"before / after: {doc['load_before']:.2f} / {doc['load_after']:.2f}",
        f"- {doc['runs']} timed runs per row after 1 warm-up, alternating; every host's grep caches removed "
        "before each sample; floor = (client CPU + hosts' CPU) / "
        f"{cpus} CPUs: the hosts and the client share this machine's CPUs, so no wall time is below it", "",
        "| tool | median s | min | max | this / fleetctl | client CPU s | hosts' CPU s | "
        "hosts' CPU per host ms | floor s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for tool, samples in c["wall"].items():
        s = report.stats(samples)
        client, on_hosts = report.med(c["client_cpu"][tool]), report.med(c["hosts_cpu"][tool])
        lines.append(f"| {tool} | {s['median']:.2f} | {s['min']:.2f} | {s['max']:.2f} | {s['median'] / base:.2f} | "
                     f"{client:.2f} | {on_hosts:.2f} | {on_hosts / FIRST_RUN_HOSTS * 1000:.0f} | "
                     f"{(client + on_hosts) / cpus:.2f} |")
    return "\n".join(lines + profile_c(c)) + "\n"


def profile_c(c: dict) -> list[str]:
    """Where one host's CPU goes (from the rows above, per host), the module's phases in-process;
    then the CPU ratio ansible-core / fleetctl (what bounds the wall-time ratio on shared CPUs), the
    search S per host it would take for 2.5, and the best ratio a fresh SSH session allows."""
    return host_parts(c) + phase_lines(c) + bound_lines(c)


def per_host(c: dict, tool: str) -> float:
    """The hosts' CPU of one sample of ``tool`` (median), ms per host."""
    return report.med(c["hosts_cpu"][tool]) / FIRST_RUN_HOSTS * 1000


def total(c: dict, tool: str) -> float:
    """Client + hosts' CPU seconds of one sample of ``tool`` (medians)."""
    return report.med(c["client_cpu"][tool]) + report.med(c["hosts_cpu"][tool])


def host_parts(c: dict) -> list[str]:
    true, py, agent = (per_host(c, row) for row in SESSION_ROWS)
    ping, one = per_host(c, "fleetctl ping"), per_host(c, "fleetctl probe grep, one file")
    first = per_host(c, "fleetctl")
    return ["", f"Hosts' CPU per host, fleetctl first run (ms; the rows above, / {FIRST_RUN_HOSTS}; the session "
            "rows are plain OpenSSH sessions with paramiko's key exchange, all hosts at once):", "",
            "| part | ms |", "| --- | ---: |",
            f"| sshd: connection, key exchange, login, the login shell (`{SESSION_ROWS[0]}`) | {true:.0f} |",
            f"| + the venv's python starting and ending (`{SESSION_ROWS[1]}` less the above) | {py - true:.0f} |",
            f"| + fleetctl's agent start code, its compiled code from the host's cache (no request) | "
            f"{agent - py:.0f} |",
            f"| = a fresh agent (`{SESSION_ROWS[2]}`) | {agent:.0f} |",
            f"| fleetctl `ping`: paramiko's session, the agent serving its hello and exit | {ping:.0f} |",
            f"| + the module, the answer (grep of one file less `ping`) | {one - ping:.0f} |",
            f"| + the search of sglang/srt (first run less one-file grep) | {first - one:.0f} |",
            f"| fleetctl, the whole first run | {first:.0f} |",
            f"| fleetctl-persist (kept connections and agents), the whole first run | "
            f"{per_host(c, 'fleetctl-persist'):.0f} |",
            f"| ansible-core (ControlPersist), the whole job (same module) | {per_host(c, 'ansible-core'):.0f} |"]


def phase_lines(c: dict) -> list[str]:
    phases = c["phases"]
    files = phases["list the tree (scandir)"] + phases["open, read, close 2,602 files"]
    first, wall = per_host(c, "fleetctl"), report.med(c["wall"]["fleetctl"])
    lines = ["", f"The module's first search in-process, under the hosts' python ({SYS_PY}; CPU ms, median; "
             "sglang/srt, 38 MB):", "", "| phase | ms |", "| --- | ---: |"]
    lines += [f"| {name} | {ms:.1f} |" for name, ms in phases.items()]
    return lines + ["", f"fleetctl's hosts alone: {first:.0f} ms per host x {FIRST_RUN_HOSTS} / 2 CPUs = "
                    f"{first * FIRST_RUN_HOSTS / 2000:.2f} s of its {wall:.2f} s wall time. Of the search's "
                    f"{phases['the whole first search']:.0f} ms in-process: the file system (list, open, read) "
                    f"{files:.0f}, CPython's scans of the text {sum(phases[k] for k in PHASE_SCAN):.0f}, "
                    f"fleetctl's own {sum(phases[k] for k in PHASE_OURS):.0f}."]


def bound_lines(c: dict) -> list[str]:
    """Per host: each tool's own cost (client, ssh, agent or ansible's steps) beside the search S,
    which both tools' hosts spend alike (they run the same module); and the ratio if fleetctl's own
    were no more than a fresh session's sshd and python (no client, no agent)."""
    fleet, ansible = total(c, "fleetctl"), total(c, "ansible-core")
    search = per_host(c, "fleetctl") - per_host(c, "fleetctl probe grep, one file")
    fixed_f = fleet / FIRST_RUN_HOSTS * 1000 - search
    fixed_a = ansible / FIRST_RUN_HOSTS * 1000 - search
    session = per_host(c, SESSION_ROWS[1])
    client = report.med(c["client_cpu"]["fleetctl"]) / FIRST_RUN_HOSTS * 1000
    walls = {tool: report.med(c["wall"][tool]) for tool in ("ansible-core", "fleetctl", "openssh-x25519")}
    return ["", f"Wall time ansible-core / fleetctl {walls['ansible-core'] / walls['fleetctl']:.2f}; ansible-core / "
            f"openssh-x25519 (plain ssh running the same script, fresh connections) "
            f"{walls['ansible-core'] / walls['openssh-x25519']:.2f}.",
            "", f"CPU ratio ansible-core / fleetctl (client + hosts): {ansible:.2f} / {fleet:.2f} = "
            f"{ansible / fleet:.2f}. Per host: ansible-core's own {fixed_a:.0f} ms, fleetctl's own {fixed_f:.0f} ms "
            f"(client {client:.0f}, the rest on the host: ssh, python, agent), plus the search both run, S = "
            f"{search:.0f} ms: ({fixed_a:.0f} + S) / ({fixed_f:.0f} + S) is 2.5 only for S <= "
            f"{(fixed_a - 2.5 * fixed_f) / 1.5:.0f} ms, or, with this S, fleetctl's own <= "
            f"{(fixed_a + search) / 2.5 - search:.0f} ms. A fresh session's sshd and python alone take "
            f"{session:.0f} ms of a host (`{SESSION_ROWS[1]}`): a tool on fresh connections that spent nothing "
            f"else, no client CPU and no agent, would reach ({fixed_a:.0f} + {search:.0f}) / ({session:.0f} + "
            f"{search:.0f}) = {(fixed_a + search) / (session + search):.2f}."]


EARLIER_C = "### (c), earlier runs (newest first)"


def replace_section_c(text: str, section: str) -> str:
    """bench/probe_search.md with this run's (c) section first, the earlier runs' kept below it
    (their headings one level down), or the section added at the end."""
    head, _, kept = text.partition(SECTION_C)
    kept = kept.replace(EARLIER_C, "").strip("\n")
    if kept:
        kept = "\n".join("#" + line if line.startswith("## ") else line for line in kept.splitlines())
        when = re.search(r"date: (\S+ \S+)", kept)
        kept = f"\n{EARLIER_C}\n\n### (c), the run of {when.group(1) if when else 'before'}\n\n{kept}\n"
    return head.rstrip("\n") + "\n\n" + section + re.sub(r"\n{3,}", "\n\n", kept)
