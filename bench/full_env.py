"""Issue 16's figures on the FULL SGLang 0.5.23 environment (207 distributions, ~9.5 GB, ~76,000
files), 1 source and 2 targets on a 3-host lab of real sshd hosts, whole commands side by side:

- overlay of the whole venv onto 2 fresh targets (one stream through the controller, forwarded to
  both) vs ``ssh src tar -c | tee | ssh dst tar -x`` to the same 2 targets through the controller;
  ``--direct`` (each target pulls from the source itself); ``rsync -a`` (one target pulls from the
  source over ssh: one hop); then the overlay again with nothing changed (time, SSH bytes through
  the controller, against the fresh copy's);
- the controller's peak RSS (its own process, ``wait4``) during each overlay;
- ``drift --verify-files`` per host, cold (no hash cache on the host) and warm;
- release build from ``adopt`` on lab1: releases under /opt/fleetctl, one mount with the base
  (hard links), and under /srv/fleetctl, another bind mount of the lab host (copies); deploy of the
  DDTree release (patched files) and rollback (switch + restart + /health).

Disk: at most 3 full venvs at once (~29 GB); every tree is removed at the end (the lab is purged).
The wheelhouse is the machine's cache (scripts/wheelhouse.py, ``make wheels``), never removed.
Steps run in the order ``--steps`` names (default: every measurement, the 10 GB copies 3 times).

    .venv/bin/python bench/full_env.py [--runs 3] [--steps overlay,drift,...]   (writes bench/full_env.md)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from jobs import BenchError  # noqa: E402
from lab_support import LabHandle  # noqa: E402
from overlay import COUNTING_CLI  # noqa: E402  (the CLI counting its SSH bytes, as bench/overlay.py runs it)

from fleetctl.lab import LabPaths, lab_down, lab_up  # noqa: E402
from fleetctl.release.spec import load_spec  # noqa: E402

LAB = ROOT / ".fleetctl" / "bench-full-env-lab"
BASE = f"127.{100 + int(hashlib.sha256(str(ROOT).encode()).hexdigest(), 16) % 100}.79.0"  # per checkout
LOCK = ROOT / "playbooks/files/locks/sglang-0.5.23-full.lock"
WHEELS = os.environ.get("FLEETCTL_FULL_WHEELS", "/var/cache/fleetctl-wheels/sglang-0.5.23")
VENV = "/opt/ml-env"
TAR_DST, RS_DST = "/opt/tar-dst", "/opt/rs-dst"
PLAIN = ROOT / "playbooks/releases/sglang-0.5.23-full-lab.yml"
DDTREE = ROOT / "playbooks/releases/ddtree-sglang-0.5.23-full-lab.yml"
TARGETS = ("lab2", "lab3")
SAMPLES = ROOT / ".fleetctl" / "bench-full-env.json"  # every sample as it comes (report again: --report-only)


class Sample(dict[str, float]):
    """seconds, and where measured: bytes (through the controller), rss_mb (the controller's peak)."""


def measured(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str, Sample]:
    """Run ``argv`` to the end; its exit code, output and its own peak RSS (wait4, this process only)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                Sample(seconds=took, rss_mb=usage.ru_maxrss / 1024))


class FullEnv:
    def __init__(self, runs: int, lock: Path) -> None:
        self.runs, self.lock = runs, lock
        self.lab: LabHandle | None = None
        self.samples: dict[str, list[Sample]] = {}
        self.saved = SAMPLES
        self.facts: dict[str, Any] = {}
        self.command = ".venv/bin/python bench/full_env.py " + shlex.join(sys.argv[1:])

    # --- plumbing ---------------------------------------------------------------------------------
    @property
    def h(self) -> LabHandle:
        assert self.lab is not None
        return self.lab

    def ssh(self, host: str, command: str, timeout: float = 1800) -> str:
        proc = self.h.ssh(host, command, check=False, timeout=timeout)
        if proc.returncode != 0:
            raise BenchError(f"{host}: `{command[:200]}` exited {proc.returncode}: {proc.stderr[-1500:]}")
        return proc.stdout

    def fleetctl(self, *args: str, counted: bool = False, ok: tuple[int, ...] = (0,)) -> tuple[dict[str, Any], Sample]:
        head = [sys.executable, "-c", COUNTING_CLI] if counted else [str(ROOT / ".venv/bin/fleetctl")]
        argv = [*head, "-i", str(self.h.inventory_path), "-e", f"fleetctl_wheelhouse={WHEELS}", *args, "--json"]
        rc, out, err, sample = measured(argv)
        if rc not in ok:
            raise BenchError(f"fleetctl {shlex.join(args)[:300]} exited {rc}: {err[-1500:]} {out[-1500:]}")
        if counted:
            sent, got = err.rsplit("@@BYTES ", 1)[1].split()
            sample["bytes"] = int(sent) + int(got)
        return json.loads(out), sample

    def keep(self, name: str, sample: Sample) -> None:
        self.samples.setdefault(name, []).append(sample)
        self.saved.write_text(json.dumps({"samples": self.samples, "facts": self.facts, "runs": self.runs}))
        extra = "".join(f", {k} {v:,.1f}" for k, v in sample.items() if k != "seconds")
        print(f"  {name}: {sample['seconds']:.1f} s{extra}", flush=True)

    def disk_gb(self) -> float:
        return shutil.disk_usage(str(ROOT)).free / 1e9

    def give_ssh(self, target: str) -> None:
        """The lab key in the target's /root/.ssh and lab1's pinned host key (for --direct and rsync)."""
        ssh_dir = self.h.dir / "hosts" / target / "root" / ".ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh_dir / "id_ed25519").write_bytes(self.h.key_path.read_bytes())
        (ssh_dir / "id_ed25519").chmod(0o600)
        address = self.h.addresses["lab1"]
        pinned = [line for line in self.h.known_hosts.read_text().splitlines()
                  if address in line.split(" ", 1)[0].split(",") or f"[{address}]" in line.split(" ", 1)[0]]
        (ssh_dir / "known_hosts").write_text("\n".join(pinned) + "\n")

    def fresh(self, *paths: str, venv: bool = True) -> None:
        """Remove ``paths`` on both targets; the first is made again as an empty venv (or folder)."""
        q = " ".join(shlex.quote(p) for p in paths)
        make = f"/usr/bin/python3 -m venv --without-pip {shlex.quote(paths[0])}" if venv else f"mkdir -p {q}"
        for host in TARGETS:
            self.ssh(host, f"rm -rf {q} && {make}")
        subprocess.run(["sync"], check=False)

    # --- the steps ----------------------------------------------------------------------------------
    def setup(self) -> None:
        if not shutil.which("rsync"):
            subprocess.run(["apt-get", "install", "-y", "-qq", "rsync"], check=True, capture_output=True)
        subprocess.run([sys.executable, str(ROOT / "scripts/wheelhouse.py"), "fetch", str(LOCK), WHEELS], check=True)
        self.lab = LabHandle.from_fleet(lab_up(3, LAB, BASE))
        for target in TARGETS:
            self.give_ssh(target)
        print(f"source: venv create from {self.lock.name} on lab1 (free disk {self.disk_gb():.1f} GB)", flush=True)
        doc, sample = self.fleetctl("-l", "lab1", "venv", "create", "--venv", VENV, "--python", "3.11", "--lock",
                                    str(self.lock), "--wheelhouse", WHEELS, "--no-compile")
        if doc["hosts"]["lab1"]["value"]["created"]:  # not a resumed run's check of the same pins
            self.keep("venv create --lock (source, 207 wheels)", sample)
        du = self.ssh("lab1", f"du -sb {VENV} && find {VENV} -type f | wc -l && "
                              f"ls -d {VENV}/lib/python3.*/site-packages/*.dist-info | wc -l").split()
        # counted on the host: a venv kept from an earlier run reports no new installs
        self.facts.update(venv_bytes=int(du[0]), venv_files=int(du[2]), dists=int(du[3]))

    def tar(self) -> Sample:
        """``ssh src tar -c | tee FIFO | ssh dst1 tar -x`` and ``ssh dst2 tar -x < FIFO``: one read of
        the source, two writes, all through this machine."""
        ssh = shlex.join(["ssh", *self.h.ssh_options()])
        a = self.h.addresses
        with tempfile.TemporaryDirectory() as tmp:
            fifo = f"{tmp}/to-lab3"
            os.mkfifo(fifo)
            script = (f"set -o pipefail; {ssh} root@{a['lab3']} 'tar -C {TAR_DST} -xf -' < {fifo} & "
                      f"{ssh} root@{a['lab1']} 'tar -C {VENV} -cf - .' | tee {fifo} | "
                      f"{ssh} root@{a['lab2']} 'tar -C {TAR_DST} -xf -'; first=$?; wait $!; exit $(( first | $? ))")
            rc, out, err, sample = measured(["bash", "-c", script])
        if rc != 0:
            raise BenchError(f"tar pipeline exited {rc}: {err[-1500:]}")
        return sample

    def rsync(self) -> Sample:
        inner = "ssh -F /dev/null -o StrictHostKeyChecking=yes -o BatchMode=yes -i /root/.ssh/id_ed25519"
        command = f"rsync -a -e {shlex.quote(inner)} root@{self.h.addresses['lab1']}:{VENV}/ {RS_DST}/"
        start = time.perf_counter()
        self.ssh("lab2", command)
        return Sample(seconds=time.perf_counter() - start)

    def overlay(self, *extra: str, to: str = VENV, hosts: str = "lab2,lab3") -> tuple[dict[str, Any], Sample]:
        doc, sample = self.fleetctl("-l", hosts, "venv", "overlay", "--from", "lab1", "--venv", VENV,
                                    "--to-venv", to, *extra, counted=True)
        return doc, sample

    def step_tar(self) -> None:
        self.fresh(TAR_DST, venv=False)
        self.keep("ssh src tar -c | tee | ssh dst tar -x (2 targets, via controller)", self.tar())
        self.clear(TAR_DST)

    def step_direct(self) -> None:
        self.fresh(VENV)
        self.keep("venv overlay --direct (2 targets)", self.overlay("--direct")[1])
        self.clear(VENV)

    def step_overlay(self) -> None:
        """The overlay onto both fresh targets, then again with nothing changed."""
        self.fresh(VENV)
        doc, sample = self.overlay()
        self.facts["overlay_written"] = [h["value"]["applied"]["written"] for h in doc["hosts"].values()]
        self.keep("venv overlay (2 targets, via controller)", sample)
        doc, sample = self.overlay()
        assert doc["line"] == "2 targets: 0 changed, 2 nothing to change", doc["line"]
        self.keep("venv overlay again, nothing changed (2 targets)", sample)
        self.ssh("lab3", f"rm -rf {VENV}")  # lab2's stays: drift, and the re-run after a change (step again)
        self.step_again()

    def step_linked(self) -> None:
        """lab2's venv as hard links of lab1's, made from this machine (no disk, no copy; what a
        second identical install would hold), then overlaid: nothing to send, its hash cache cold."""
        golden, twin = (self.h.dir / "hosts" / h / "opt" / VENV[len("/opt/"):] for h in ("lab1", "lab2"))
        self.ssh("lab2", f"rm -rf {VENV}")
        subprocess.run(["cp", "-al", str(golden), str(twin)], check=True)
        doc, sample = self.overlay(hosts="lab2")
        assert doc["line"] == "1 targets: 0 changed, 1 nothing to change", doc["line"]
        self.keep("venv overlay onto an identical venv, target hash cache cold (1 target)", sample)

    def step_again(self) -> None:
        for _ in range(self.runs):
            doc, sample = self.overlay(hosts="lab2")
            assert doc["line"] == "1 targets: 0 changed, 1 nothing to change", doc["line"]
            self.keep("venv overlay again, nothing changed (1 target)", sample)

    def step_rsync(self) -> None:
        self.fresh(RS_DST, venv=False)
        self.keep("rsync -a (1 target pulls from the source: one hop)", self.rsync())
        self.clear(RS_DST)

    def clear(self, path: str) -> None:
        for host in TARGETS:
            self.ssh(host, f"rm -rf {shlex.quote(path)}")

    def step_drift(self) -> None:
        """drift --verify-files per host: lab1 (the source), lab2 (the overlay's target)."""
        skip = () if self.lock == LOCK else ("--skip", "unsatisfied")  # a small lock: no closure
        cache = {h: LabPaths(self.h.dir).host_dir(h) / "var-lib-fleetctl" / "cache" for h in ("lab1", "lab2")}
        for host in ("lab1", "lab2"):
            shutil.rmtree(cache[host], ignore_errors=True)
            for kind in ["cold"] + ["warm"] * self.runs:  # cold once: it hashes all 10 GB
                doc, sample = self.fleetctl("-l", host, "drift", "--venv", VENV, "--verify-files", *skip, ok=(0, 1))
                kinds = {f["kind"] for f in doc["hosts"][host]["findings"]}
                assert kinds <= {"shared-file", "overlay"}, kinds  # a complete venv is clean
                self.keep(f"drift --verify-files {host} ({kind} hash cache)", sample)

    def deploy(self, spec: Path, name: str, *extra: str) -> None:
        doc, sample = self.fleetctl("-l", "lab1", *extra, "deploy", str(spec))
        value = doc["hosts"]["lab1"]["value"]
        assert value["outcome"] == "deployed", value
        self.facts[f"build {name}"] = {k: value["build"].get(k) for k in ("linked", "copied", "seconds")}
        self.keep(f"deploy {name}, whole command", sample)
        self.keep(f"release build alone: {name}", Sample(seconds=value["build"].get("seconds", -1)))

    def step_releases(self) -> None:
        """On lab1, from adopt /opt/ml-env: releases under /opt/fleetctl (one mount: hard links), the
        DDTree release (patched files), rollbacks; then releases under /srv/fleetctl (another bind
        mount of the lab host: copies)."""
        self.deploy(PLAIN, "plain from adopt, /opt -> /opt (hard links)")
        self.deploy(DDTREE, "DDTree from adopt, /opt -> /opt (hard links, patched)")
        ids = [load_spec(PLAIN).release_id, load_spec(DDTREE).release_id]
        for i in range(self.runs):
            self.keep("rollback on lab1 (switch + restart + /health)", self.fleetctl("-l", "lab1", "rollback", "--to",
                                                                                       ids[i % 2])[1])
        stop = "f={}/service/sglang.pid; [ -f $f ] && kill -9 $(head -1 $f); rm -rf {} {}; true"
        self.ssh("lab1", stop.format("/var/lib/fleetctl", "/opt/fleetctl", "/var/lib/fleetctl"))
        self.deploy(PLAIN, "plain from adopt, /opt -> /srv (copies, across mounts)",
                    "-e", "fleetctl_root=/srv/fleetctl", "-e", "fleetctl_state_dir=/var/lib/fleetctl-srv")
        self.ssh("lab1", stop.format("/var/lib/fleetctl-srv", "/srv/fleetctl", "/var/lib/fleetctl-srv"))


def median(xs: list[Sample], key: str = "seconds") -> float:
    return float(statistics.median(s[key] for s in xs if key in s))


def known(line: str, *figures: float) -> list[str]:
    """``line``, unless a step it needs did not run in this run (one of its figures is nan)."""
    return [] if any(math.isnan(x) for x in figures) else [line]


def report(bench: FullEnv, load: float) -> str:
    s, f = bench.samples, bench.facts

    def med(name: str, key: str = "seconds") -> float:
        return median(s[name], key) if name in s and any(key in x for x in s[name]) else float("nan")

    rows = []
    for name, xs in s.items():
        runs = ", ".join(f"{x['seconds']:.1f}" for x in xs)
        extra = " / ".join(f"{median(xs, k) / 1e6:,.1f} MB" if k == "bytes" else f"{median(xs, k):.0f} MB RSS"
                           for k in ("bytes", "rss_mb") if k in xs[0])
        rows.append(f"| {name.replace('|', chr(92) + '|')} | {median(xs):.2f} | {runs} | {extra} |")
    tar = med("ssh src tar -c | tee | ssh dst tar -x (2 targets, via controller)")
    ov, direct = med("venv overlay (2 targets, via controller)"), med("venv overlay --direct (2 targets)")
    again = "venv overlay again, nothing changed (2 targets)"
    again = again if again in s else "venv overlay again, nothing changed (1 target)"
    fresh = "venv overlay (2 targets, via controller)" if again.endswith("(2 targets)") else \
        "venv overlay (1 target, via controller)"
    warm = {h: med(f"drift --verify-files {h} (warm hash cache)") for h in ("lab1", "lab2")}
    overlays = [x["rss_mb"] for name, xs in s.items() if name.startswith("venv overlay") for x in xs]
    gb = f.get("venv_bytes", float("nan")) / 1e9
    lines = [
        f"# The full SGLang 0.5.23 environment ({time.strftime('%Y-%m-%d')}): {f.get('dists')} distributions, "
        f"{gb:.2f} GB, {f.get('venv_files', 0):,} files", "",
        f"Command: {'; '.join(f'`{c}`' for c in f.get('commands') or [bench.command])} (3-host lab, 1 source "
        f"and 2 targets, 2-core machine, load average {load:.1f} at the start; medians of every run of each row, "
        "its runs listed)", "",
        "| what | median s | runs s | median bytes through the controller / controller peak RSS |",
        "|---|---:|---|---|", *rows, "",
        *known(f"- overlay / tar through the controller: {ov / tar:.2f}x (target: at most 1.0x)", ov, tar),
        *known(f"- --direct / tar: {direct / tar:.2f}x", direct, tar),
        *known(f"- re-run with nothing changed: {med(again):.2f} s (target: under 3 s), "
               f"{med(again, 'bytes') / 1e6:.3f} MB = {100 * med(again, 'bytes') / med(fresh, 'bytes'):.4f}% of the "
               "fresh overlay's bytes (target: under 0.1%)", med(again), med(again, "bytes"), med(fresh, "bytes")),
        *known(f"- drift --verify-files warm: lab1 {warm['lab1']:.2f} s, lab2 {warm['lab2']:.2f} s "
               "(target: at most 1.5 s)", *warm.values()),
        f"- controller peak RSS over every overlay: {max(overlays, default=float('nan')):.0f} MB "
        "(target: under 300 MB)",
        *[f"- release build {k[6:]}: {v}" for k, v in f.items() if k.startswith("build ")],
        "- bytes: bytes of the fleetctl process (both hops: source -> controller -> targets): paramiko's SSH",
        "  packets plus the stream it moves through its ssh children's pipes (transport/openssh.py); RSS: that",
        "  process's own peak (wait4), the ssh children of --direct run on the targets.", "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lock", type=Path, default=LOCK, help="another lock (a small one tries the bench out)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "full_env.md")
    ap.add_argument("--steps", default="overlay,drift,releases,tar,direct,rsync,overlay,tar,direct,rsync,overlay,"
                    "tar,direct,rsync", help="in this order (drift and again need a step overlay before)")
    ap.add_argument("--keep-lab", action="store_true", help="leave the lab (and its venvs) up at the end")
    ap.add_argument("--resume", action="store_true", help="add to the saved samples; the lab and source kept")
    ap.add_argument("--report-only", action="store_true", help=f"write the report from {SAMPLES.name} again")
    opts = ap.parse_args()
    bench = FullEnv(opts.runs, opts.lock)
    bench.saved = SAMPLES.with_name(f"bench-{opts.out.stem}.json")
    load = os.getloadavg()[0]
    try:
        if opts.resume and bench.saved.exists():
            saved = json.loads(bench.saved.read_text())
            bench.samples, bench.facts = saved["samples"], saved["facts"]
        if opts.report_only:
            saved = json.loads(bench.saved.read_text())
            bench.samples, bench.facts, bench.runs = saved["samples"], saved["facts"], saved["runs"]
        else:
            bench.facts.setdefault("commands", []).append(bench.command)  # a resumed run adds its own
            bench.setup()
            for step in opts.steps.split(","):
                print(f"== {step} (free disk {bench.disk_gb():.1f} GB)", flush=True)
                getattr(bench, f"step_{step}")()
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if not opts.report_only and not opts.keep_lab:
            lab_down(LAB, purge=True)
            shutil.rmtree(LAB, ignore_errors=True)
    text = report(bench, load)
    opts.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
