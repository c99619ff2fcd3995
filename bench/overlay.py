"""`fleetctl venv overlay` against `rsync -a` over ssh, on a lab of two real sshd hosts.

lab1 holds a venv with the real sglang 0.5.23 wheel installed (123 MB, 6,500 files). Each round
gives lab2 a fresh venv and copies the site-packages once with each tool (overlay, a
``ssh lab1 tar -c | ssh lab2 tar -x`` pipe, rsync) (the order alternates):
the overlay goes lab1 -> this machine -> lab2 as one compressed stream; rsync runs on lab1 and
pushes straight to lab2 over ssh (lab1 gets the lab's client key and the pinned known_hosts;
host keys are checked). Then the overlay runs again with nothing changed. Medians of --runs
rounds; bytes are SSH bytes through this machine (paramiko's packetizer) for the overlay and
rsync's own --stats for rsync. Starts its own lab and takes it down at the end.

    .venv/bin/python bench/overlay.py [--runs 5] [--baseline DIR]

--baseline DIR: a checkout of fleetctl from before a change (`git archive REV | tar -x -C DIR`); its
CLI runs a fresh overlay in every round too, on the same lab, in alternating order ("overlay
(baseline)"), so before and after are measured under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetctl.lab import LabPaths, lab_down, lab_up  # noqa: E402

LAB_DIR = REPO / ".fleetctl" / "bench-overlay-lab"
BASE = "127.0.92.0"
WHEELS = REPO / ".cache" / "wheels"
SGLANG = "0.5.23"
SRC, DST, RS_DST, TAR_DST = "/root/ov-src", "/root/ov-dst", "/root/rs-dst", "/root/tar-dst"
SITE = "lib/python3.11/site-packages"
# Runs the CLI in a child process that counts the bytes its SSH transports write and read.
COUNTING_CLI = """
import sys, paramiko.packet as p
n = {"out": 0, "in": 0}
w, r = p.Packetizer.write_all, p.Packetizer.read_all
def write_all(self, out):
    n["out"] += len(out); return w(self, out)
def read_all(self, k, check_rekey=False):
    n["in"] += k; return r(self, k, check_rekey)
p.Packetizer.write_all, p.Packetizer.read_all = write_all, read_all
import fleetctl.transport.openssh as o  # the bulk stream through ssh processes: its payload bytes
s_, r_ = o.OpenSSHStream.send, o.OpenSSHStream.recv
def send(self, data):
    n["out"] += len(data); return s_(self, data)
def recv(self, k, timeout):
    data = r_(self, k, timeout); n["in"] += len(data); return data
o.OpenSSHStream.send, o.OpenSSHStream.recv = send, recv
i_ = o.OpenSSHStream.__init__
def init(self, argv, host):  # the command line (a stream process's inline code) goes to the host too
    n["out"] += len(argv[-1]); return i_(self, argv, host)
o.OpenSSHStream.__init__ = init
from fleetctl.cli.main import main
rc = main(sys.argv[1:])
sys.stderr.write("@@BYTES %d %d\\n" % (n["out"], n["in"]))
sys.exit(rc)
"""


def sh(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


class Bench:
    def __init__(self, runs: int, baseline: str | None = None) -> None:
        self.runs, self.baseline = runs, baseline
        self.paths = LabPaths(LAB_DIR)
        self.addr: dict[str, str] = {}
        self.cpu: list[float] = []  # controller CPU s of each fresh overlay
        self.apply_s: list[float] = []  # the target's apply time of each fresh overlay
        self.plan_s: list[float] = []  # --dry-run: listing both sides and planning, before any byte moves

    def ssh_opts(self) -> list[str]:
        return ["-F", "/dev/null", "-o", "StrictHostKeyChecking=yes", "-o",
                f"UserKnownHostsFile={self.paths.known_hosts}", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-i", str(self.paths.client_key)]

    def ssh(self, host: str, command: str) -> subprocess.CompletedProcess[str]:
        proc = sh(["ssh", *self.ssh_opts(), f"root@{self.addr[host]}", command], check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{host}: `{command}` exited {proc.returncode}: {proc.stderr[-1000:]}")
        return proc

    def setup(self) -> None:
        if not shutil.which("rsync"):
            sh(["apt-get", "update", "-qq"])
            sh(["apt-get", "install", "-y", "-qq", "rsync"])
        fleet = lab_up(2, LAB_DIR, BASE)
        self.addr = {h.name: h.address for h in fleet.hosts}
        found = sorted(WHEELS.glob(f"sglang-{SGLANG}-*.whl"))
        if not found:
            sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(WHEELS),
                f"sglang=={SGLANG}"])
            found = sorted(WHEELS.glob(f"sglang-{SGLANG}-*.whl"))
        visible = LAB_DIR / "wheels" / found[0].name
        visible.parent.mkdir(exist_ok=True)
        shutil.copyfile(found[0], visible)
        ssh_dir = self.paths.host_dir("lab1") / "root" / ".ssh"  # lab1 pushes to lab2 for rsync
        shutil.copyfile(self.paths.client_key, ssh_dir / "id_ed25519")
        (ssh_dir / "id_ed25519").chmod(0o600)
        shutil.copyfile(self.paths.known_hosts, ssh_dir / "known_hosts")
        q = shlex.quote(SRC)
        self.ssh("lab1", f"rm -rf {q} && /usr/bin/python3 -m venv {q} && {q}/bin/python -m pip install -q "
                         f"--no-deps --no-index --no-compile --disable-pip-version-check {shlex.quote(str(visible))}")

    def fresh_target(self) -> None:
        self.ssh("lab2", f"rm -rf {DST} {RS_DST} {TAR_DST} && /usr/bin/python3 -m venv --without-pip {DST} "
                         f"&& mkdir -p {RS_DST}/{SITE} {TAR_DST}/{SITE}")
        sh(["sync"])
        time.sleep(1)  # let the removal's writeback settle before timing

    def overlay(self, *extra: str, checkout: str | None = None) -> tuple[float, int]:
        argv = [sys.executable, "-c", COUNTING_CLI, "-i", str(self.paths.inventory), "-l", "lab2", "venv",
                "overlay", "--from", "lab1", "--venv", SRC, "--to-venv", DST, "--json", *extra]
        before = os.times()
        start = time.monotonic()
        # `python -c` imports fleetctl from its working folder first: this checkout's, or the baseline's
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=checkout or REPO)
        elapsed = time.monotonic() - start
        after = os.times()
        if proc.returncode != 0:
            raise SystemExit(f"overlay exited {proc.returncode}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
        sent, got = proc.stderr.rsplit("@@BYTES ", 1)[1].split()
        # controller CPU (the CLI and its ssh children) and the target's own apply time
        self.cpu.append(after.children_user + after.children_system - before.children_user - before.children_system)
        applied = [h.get("value", {}).get("applied") for h in json.loads(proc.stdout).get("hosts", {}).values()]
        if applied and applied[0]:
            self.apply_s.append(float(applied[0]["seconds"]))
        return elapsed, int(sent) + int(got)

    def tar(self) -> tuple[float, int]:
        """``ssh lab1 tar -c | ssh lab2 tar -x`` through this machine, the same two hops as the overlay."""
        ssh = " ".join(shlex.quote(a) for a in ["ssh", *self.ssh_opts()])
        script = (f"set -o pipefail; {ssh} root@{self.addr['lab1']} 'tar -C {SRC}/{SITE} -cf - .' | "
                  f"{ssh} root@{self.addr['lab2']} 'tar -C {TAR_DST}/{SITE} -xf -'")
        start = time.monotonic()
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
        elapsed = time.monotonic() - start
        if proc.returncode != 0:
            raise SystemExit(f"tar pipe exited {proc.returncode}: {proc.stderr[-1000:]}")
        return elapsed, 0

    def rsync(self) -> tuple[float, int]:
        inner = ("ssh -F /dev/null -o StrictHostKeyChecking=yes -o UserKnownHostsFile=/root/.ssh/known_hosts "
                 "-o BatchMode=yes -i /root/.ssh/id_ed25519")
        command = (f"rsync -a --stats -e {shlex.quote(inner)} {SRC}/{SITE}/ "
                   f"root@{self.addr['lab2']}:{RS_DST}/{SITE}/")
        start = time.monotonic()
        proc = self.ssh("lab1", command)
        elapsed = time.monotonic() - start
        stats = dict(line.split(":", 1) for line in proc.stdout.splitlines() if ":" in line)
        total = sum(int(stats[k].split()[0].replace(",", "")) for k in ("Total bytes sent", "Total bytes received"))
        return elapsed, total

    def run(self) -> dict[str, list[tuple[float, int]]]:
        samples: dict[str, list[tuple[float, int]]] = {"overlay": [], "tar": [], "overlay re-run": []}
        for i in range(self.runs):
            self.fresh_target()
            start = time.monotonic()
            self.overlay("--dry-run")  # listing both sides and planning: the cost before the first byte
            self.plan_s.append(time.monotonic() - start)
            self.cpu.pop()
            order = ("overlay", "tar", "rsync") if i % 2 == 0 else ("rsync", "tar", "overlay")
            if self.baseline:
                order = ("overlay", "overlay (baseline)", "tar") if i % 2 == 0 else ("tar", "overlay (baseline)",
                                                                                    "overlay")
            for name in order:
                samples.setdefault(name, []).append(self.measure(name))
                print(f"round {i + 1}: {name} {samples[name][-1][0]:.2f}s", flush=True)
                if name == "overlay":  # at once, before the next copy's fresh start removes what it landed
                    samples["overlay re-run"].append(self.overlay())
                    self.cpu.pop()
                    print(f"round {i + 1}: overlay re-run {samples['overlay re-run'][-1][0]:.2f}s", flush=True)
        return samples

    def measure(self, name: str) -> tuple[float, int]:
        """One fresh copy by ``name``; the overlays' CPU and apply figures are the new code's only."""
        if name == "overlay":
            self.fresh_target()
            return self.overlay()
        if name == "tar":  # the same start as the overlays': a fresh, empty target, the disk settled
            self.fresh_target()
            return self.tar()
        if name == "overlay (baseline)":
            self.fresh_target()
            found = self.overlay(checkout=self.baseline)
            self.cpu.pop()
            if self.apply_s:
                self.apply_s.pop()
            return found
        return getattr(self, name)()

    def profile(self) -> list[str]:
        med = statistics.median
        return [
            "", "Where a fresh overlay's time goes (medians):", "",
            f"- listing both sides and planning (`--dry-run` on the fresh target, CLI start and SSH connects "
            f"included): {med(self.plan_s):.2f} s",
            f"- the target's apply (its `seconds`, from the plan's arrival to the manifest): "
            f"{med(self.apply_s):.2f} s", f"- controller CPU (CLI + its ssh processes): {med(self.cpu):.2f} s",
        ]


def report(samples: dict[str, list[tuple[float, int]]], runs: int, load: float, profile: list[str],
           command: str = "") -> str:
    med = {k: (statistics.median(t for t, _ in v), statistics.median(b for _, b in v)) for k, v in samples.items()}
    fresh_t, fresh_b = med["overlay"]
    rows = [f"| {name} | {t:.2f} | {', '.join(f'{s:.2f}' for s, _ in samples[name])} | {b / 1e6:.2f} |"
            for name, (t, b) in med.items()]
    tar_ratio = fresh_t / med["tar"][0]
    rerun_t, rerun_b = med["overlay re-run"]
    ratios = [f"overlay / tar pipe = {tar_ratio:.2f}x (target: at most 1.0x)"]
    if "rsync" in med:
        ratios.insert(0, f"overlay / rsync = {fresh_t / med['rsync'][0]:.2f}x (target: at most 1.5x)")
    if "overlay (baseline)" in med:
        ratios.append(f"baseline / tar pipe = {med['overlay (baseline)'][0] / med['tar'][0]:.2f}x")
    return "\n".join([
        "# venv overlay vs rsync -a (sglang 0.5.23 site-packages: 123 MB, 6,539 files)", "",
        f"Command: `.venv/bin/python bench/overlay.py --runs {runs}{command}` (2-host lab on 127.0.92.x, 2-core "
        "machine)", "", "| what | median s | runs s | MB on the wire |", "|---|---|---|---|", *rows, "",
        "- fresh copy: " + "; ".join(ratios),
        f"- re-run with nothing changed: {rerun_t:.2f} s, {rerun_b / 1e6:.3f} MB = "
        f"{100 * rerun_b / fresh_b:.2f}% of the fresh copy's bytes (targets: under 2 s and 1%)",
        "- overlay bytes: SSH bytes through the controller, both hops (source -> controller -> target), agent",
        "  start, the stream processes' command lines (their inline code) and listings included; rsync bytes:",
        "  rsync --stats sent + received (one hop, lab1 -> lab2);",
        "  tar: `ssh lab1 tar -c | ssh lab2 tar -x` through this machine (bytes not counted).",
        "- each copy starts from a fresh target venv (all trees removed, `sync`, 1 s); the order alternates",
        "  between rounds.",
        f"- load average when the bench started: {load:.1f} (the disk is the bottleneck: `cp -a` of the same tree",
        "  takes 2.6 s here, and single rounds of either tool vary by 3x; compare medians).", *profile, "",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", help="a checkout from before a change: its overlay runs in every round too")
    args = parser.parse_args()
    bench = Bench(args.runs, args.baseline)
    load = os.getloadavg()[0]
    try:
        bench.setup()
        samples = bench.run()
    finally:
        lab_down(LAB_DIR)
    text = report(samples, args.runs, load, bench.profile(), f" --baseline {args.baseline}" if args.baseline else "")
    (REPO / "bench" / "overlay.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
