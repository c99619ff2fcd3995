"""Source search speed: fleetctl's host-side search vs ripgrep, and `probe grep` vs OpenSSH + rg.

(a) host side alone: fleetctl/remote/source.py run as the agent runs it under a venv's python
    (`python3 -c CHILD_RUNNER`, the request on stdin) on the unpacked sglang 0.5.23 wheel's
    `sglang/srt`, vs `rg -F -n` on the same folder, same fixed-string terms.
(b) whole commands: `fleetctl probe grep ... --json` on 1 and 8 lab hosts vs plain OpenSSH
    running `rg -F -n` on the same hosts, all started at once.
(c) first run at 32 hosts (issue 37): bench/run.py's `source search, first run` (every host's grep
    caches removed before each sample) for fleetctl and ansible-core only, alternating, with the
    client's and the lab hosts' CPU seconds: on this 2-CPU machine their sum / 2 is a floor on the
    wall time. Uses bench/run.py's lab (.fleetctl/bench-lab) and peer venv; `--only c` runs it alone
    and rewrites the (c) section of bench/probe_search.md.

Every sample is checked (the same matching lines found) before it counts. Starts its own lab
(.fleetctl/bench-probe-lab on 127.0.91.x) and takes it down at the end, also on error. Writes
bench/probe_search.md.

    .venv/bin/python bench/probe_search.py [--runs 9] [--only a|b|c]

`--only a` runs part (a) alone: no lab is started and bench/probe_search.md is left as it is (the
table is printed). `--only b` runs part (b) alone (part (a) still unpacks the wheel and counts the
expected lines with rg first) and does not write the file either.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' wheel cache: sglang_support.wheel

import jobs  # noqa: E402
import report  # noqa: E402
from probe_search_first import SECTION_C, first_run_samples, markdown_c, replace_section_c  # noqa: E402
from sglang_support import wheel as cached_wheel  # noqa: E402

from fleetctl.lab import LabFleet, lab_down, lab_up  # noqa: E402
from fleetctl.remote.agent import BEGIN, CHILD_RUNNER, END  # noqa: E402
from fleetctl.transport.mux import socket_path, stop_server  # noqa: E402

LAB_DIR = ROOT / ".fleetctl" / "bench-probe-lab"
MUX_DIR = LAB_DIR / "mux"  # the kept-connection server of the --persist rows
MASTERS = Path(f"/tmp/fleetctl-bench-cm-{os.getpid()}")  # OpenSSH's: a Unix socket path must stay short
BASE = "127.0.91.0"
HOSTS = 8
VERSION = "0.5.23"
VENV = "/root/ml-env"
TERMS = ("update_mamba_state_after_mtp_verify", "disable_state_update", "mamba_intermediate", "Mamba")
SAME_KEX = ("-o", "KexAlgorithms=curve25519-sha256")  # what paramiko negotiates: the like-for-like bound
TARGETS = {"a": 3.0, "b": 1.5}

Job = Callable[[], float]




def rg_argv(folder: str, ignore_case: bool = False) -> list[str]:
    flags = ["-F", "-n", "--no-heading"] + (["-i"] if ignore_case else [])
    return ["rg", *flags, *[arg for t in TERMS for arg in ("-e", t)], folder]


def host_search_job(site: Path, expect_lines: int, inner: list[float]) -> Job:
    """The remote module in a fresh interpreter, fed as the agent feeds a venv's python; the module's
    own timer (the search without the interpreter's start) goes to ``inner``."""
    params = {"mode": "grep", "package": "sglang", "subpath": "srt", "terms": list(TERMS), "max_hits": 200}
    import hashlib
    import tempfile

    from fleetctl.transport.agent import module_source

    source = module_source("source")[0]  # with its includes, as the agent ships it
    # As the agent sends it: with the source's hash and a private code cache, so the first run
    # compiles the module and the later ones load the compiled code.
    cache = tempfile.mkdtemp(prefix="fleetctl-bench-code-")
    payload = json.dumps({"module": "source", "source": source, "params": params, "begin": BEGIN, "end": END,
                          "hash": hashlib.sha256(source.encode()).hexdigest()[:16], "cache_dir": cache}).encode()
    env = {**os.environ, "PYTHONPATH": str(site)}

    def run() -> float:
        start = time.perf_counter()
        proc = subprocess.run(["/usr/bin/python3", "-c", CHILD_RUNNER], input=payload, capture_output=True, env=env)
        took = time.perf_counter() - start
        text = proc.stdout.decode()
        answer = json.loads(text[text.rindex(BEGIN) + len(BEGIN):text.rindex(END)])
        if not answer["ok"] or answer["result"]["matched_lines"] != expect_lines:
            raise jobs.BenchError(f"host search: {answer}"[:2000])
        inner.append(answer["result"]["elapsed_ms"] / 1000)
        return took

    return run


def rg_job(folder: Path, expect_lines: int) -> Job:
    argv = rg_argv(str(folder))

    def run() -> float:
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True)
        took = time.perf_counter() - start
        if proc.returncode != 0 or len(proc.stdout.splitlines()) != expect_lines:
            raise jobs.BenchError(f"{shlex.join(argv)}: rc {proc.returncode}, {len(proc.stdout.splitlines())} lines")
        return took

    return run


def local_samples(runs: int) -> tuple[dict[str, list[float]], int]:
    """(a): unpack the wheel, agree on the answer, then alternate the two searches."""
    with tempfile.TemporaryDirectory(prefix="fleetctl-bench-site-") as tmp:
        site = Path(tmp)
        with zipfile.ZipFile(cached_wheel("sglang", VERSION)) as zf:
            zf.extractall(site)
        folder = site / "sglang" / "srt"
        lines = len(subprocess.run(rg_argv(str(folder)), capture_output=True, check=True).stdout.splitlines())
        inner: list[float] = []
        order = {"fleetctl host search": host_search_job(site, lines, inner), "rg -F": rg_job(folder, lines)}
        samples = jobs.rounds(order, runs)
        samples["(its search alone, module timer)"] = inner[-runs:]  # the warm-up round dropped
        return samples, lines


def expected_lines() -> int:
    """The matching lines rg finds in the unpacked wheel's sglang/srt (what part (b) checks against)."""
    with tempfile.TemporaryDirectory(prefix="fleetctl-bench-site-") as tmp:
        with zipfile.ZipFile(cached_wheel("sglang", VERSION)) as zf:
            zf.extractall(tmp)
        argv = rg_argv(str(Path(tmp) / "sglang" / "srt"))
        return len(subprocess.run(argv, capture_output=True, check=True).stdout.splitlines())


def install_venvs(fleet: LabFleet) -> None:
    """Each host gets /root/ml-env with the wheel, as tests/sglang_support.py does it."""
    wheel = cached_wheel("sglang", VERSION)
    visible = fleet.directory / "wheels" / wheel.name  # the lab folder is readable from every host
    visible.parent.mkdir(parents=True, exist_ok=True)
    visible.write_bytes(wheel.read_bytes())
    q = shlex.quote(VENV)
    script = (f"set -e; rm -rf {q}; /usr/bin/python3 -m venv {q}; {q}/bin/python -m pip install -q --no-deps "
              f"--no-index --no-compile --disable-pip-version-check {shlex.quote(str(visible))}")

    def one(address: str) -> None:
        proc = subprocess.run(jobs.ssh_argv(fleet.directory, address, script), capture_output=True, text=True)
        if proc.returncode != 0:
            raise jobs.BenchError(f"venv on {address}: {proc.stderr[-2000:]}")

    with ThreadPoolExecutor(max_workers=HOSTS) as pool:
        list(pool.map(one, [h.address for h in fleet.hosts]))


def fleet_samples(runs: int, lines: int) -> dict[str, dict[str, list[float]]]:
    """(b): 1 and 8 hosts, fleetctl vs OpenSSH + rg, alternating within each round."""
    fleet = lab_up(HOSTS, LAB_DIR, BASE)
    print(f"lab: {HOSTS} hosts up in {fleet.elapsed_s:.1f}s; installing sglang {VERSION} into {VENV}", flush=True)
    install_venvs(fleet)
    pyver = subprocess.run(["/usr/bin/python3", "-c", "import sys;print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    remote = shlex.join(rg_argv(f"{VENV}/lib/python{pyver}/site-packages/sglang/srt"))

    def found_all(n: int, out: str) -> bool:
        return len(out.splitlines()) == lines

    order: dict[str, Job] = {}
    for count in (1, HOSTS):
        limit = ",".join(fleet.names[:count])
        addrs = [h.address for h in fleet.hosts[:count]]
        args = ["-l", limit, "probe", "grep", *TERMS, "--subpath", "srt", "--venv", VENV]
        order[f"{count}/fleetctl probe grep"] = jobs.fleetctl_job(fleet.inventory_path, args, count)
        order[f"{count}/fleetctl --persist probe grep"] = jobs.fleetctl_job(fleet.inventory_path, args, count,
                                                                            persist=MUX_DIR)
        order[f"{count}/openssh + rg -F"] = jobs.openssh_job(LAB_DIR, addrs, remote, found_all)
        order[f"{count}/openssh-x25519 + rg -F"] = jobs.openssh_job(LAB_DIR, addrs, remote, found_all, SAME_KEX)
        order[f"{count}/openssh-persist + rg -F"] = jobs.openssh_job(
            LAB_DIR, addrs, remote, found_all, (*SAME_KEX, *jobs.persist_options(MASTERS)))
    flat = jobs.rounds(order, runs)
    out: dict[str, dict[str, list[float]]] = {}
    for key, samples in flat.items():
        hosts, _, tool = key.partition("/")
        out.setdefault(f"probe grep, {hosts} host{'s' if hosts != '1' else ''}", {})[tool] = samples
    return out


def markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [
        "# probe grep benchmark", "",
        f"- date: {doc['date']}; reproduce: `{doc['command']}` (took {doc['elapsed_s']}s)",
        f"- machine: {m['cpus']} CPUs, {m['memory_gib']} GiB, Linux {m['kernel']}; python {m['python']}; "
        f"{m['openssh']}; {doc['rg']}",
        f"- {doc['runs']} timed runs per row after 1 warm-up, the rows of a table alternating within each round; "
        f"load average (1 min) before / after: {doc['load_before']:.2f} / {doc['load_after']:.2f}",
        f"- terms (fixed strings): {', '.join(TERMS)}; {doc['lines']} matching lines in sglang {VERSION} "
        "`sglang/srt`, checked on every sample", "",
        "(a) host side alone: `python3 -c CHILD_RUNNER` (how the agent runs a module under a venv's python:",
        "interpreter start, module compile, search, JSON answer) vs `rg -F -n` on the same folder. Target: ratio <= 3.",
        "(b) whole commands: `fleetctl -i INV -l HOSTS probe grep TERMS --subpath srt --venv /root/ml-env --json`",
        "(imports, connect, agent start, search, answer) vs one plain `ssh HOST rg -F -n ...` per host, all at",
        "once. Target: ratio <= 1.5 against `openssh`. `openssh-x25519` uses the key exchange paramiko",
        "negotiates (OpenSSH's default sntrup761x25519 costs more CPU), for reference. `--persist` rows: over",
        "kept connections (fleetctl's FLEETCTL_PERSIST; OpenSSH's ControlPersist master per host), opened by",
        "the warm-up round, as ansible-core's ControlPersist is in bench/results.md.", "",
        "| job | tool | median s | min | max | ratio |", "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for job, (reference, tools) in doc["jobs"].items():
        base = report.stats(tools[reference])["median"]
        for tool, samples in tools.items():
            s = report.stats(samples)
            lines.append(f"| {job} | {tool} | {s['median']:.3f} | {s['min']:.3f} | {s['max']:.3f} | "
                         f"{s['median'] / base:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=9, help="timed runs per row after 1 warm-up (>= 7; >= 3 for c)")
    ap.add_argument("--only", choices=("a", "b", "c"),
                    help="run one part alone (a: no lab); a, b: the table is printed, probe_search.md not written; "
                         "c: its section of probe_search.md rewritten")
    args = ap.parse_args(argv)
    if args.runs < (3 if args.only == "c" else 7):
        ap.error("--runs must be at least 7 (3 with --only c: 32 hosts on a shared machine)")
    if shutil.which("rg") is None and args.only != "c":
        ap.error("parts a and b compare with ripgrep: install it (rg), or run --only c")
    rg = subprocess.run(["rg", "--version"], capture_output=True, text=True).stdout.splitlines()[0] \
        if shutil.which("rg") else "no ripgrep"
    given = sys.argv[1:] if argv is None else argv
    doc: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": report.machine(), "rg": rg,
                 "command": shlex.join([".venv/bin/python", "bench/probe_search.py", *given]),
                 "runs": args.runs, "load_before": os.getloadavg()[0], "jobs": {}}
    started = time.monotonic()
    jobs.compile_fleetctl()
    out = HERE / "probe_search.md"
    if args.only == "c":
        c = first_run_samples(args.runs)
        doc["elapsed_s"], doc["load_after"] = round(time.monotonic() - started, 1), os.getloadavg()[0]
        section = markdown_c(doc, c)
        (HERE / "probe_search.json").write_text(json.dumps({"c": doc | c}, indent=1) + "\n")  # every sample
        out.write_text(replace_section_c(out.read_text() if out.exists() else "", section))
        print(section)
        return 0
    if args.only == "b":
        doc["lines"] = expected_lines()
    else:
        local, doc["lines"] = local_samples(args.runs)
        doc["jobs"]["(a) search sglang/srt on this machine"] = ("rg -F", local)
    if args.only != "a":
        try:
            for job, tools in fleet_samples(args.runs, doc["lines"]).items():
                doc["jobs"][f"(b) {job}"] = ("openssh + rg -F", tools)
        finally:
            stop_server(socket_path(MUX_DIR))
            jobs.stop_masters(MASTERS)
            shutil.rmtree(MASTERS, ignore_errors=True)
            lab_down(LAB_DIR, purge=True)
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    doc["load_after"] = os.getloadavg()[0]
    text = markdown(doc)
    if args.only is None:
        kept = out.read_text() if out.exists() else ""
        out.write_text(text + ("\n" + SECTION_C + kept.split(SECTION_C, 1)[1] if SECTION_C in kept else ""))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
