"""`fleetctl models sync` against the star and a single copy, on a lab whose links are capped.

lab1 holds a test model (4 safetensors shards + index + config, --model-mb in all); every lab host's
upload and download is capped at --rate (fleetctl/lab/links.py: tc on loopback). For each host count N:
- single: one host-to-host copy of the model (lab1 -> lab2, `scp -r` run on lab1): the floor;
- star: N parallel `scp -r` from lab1, as a hand-written playbook pushes from a seed;
- sync: `fleetctl models sync --from lab1` to the N hosts (the pipelined chain).
Each round starts with no model on the targets; medians of --runs rounds; the source's bytes are
the model's size times the copies for scp, and the sync's own count (`source_bytes_sent`).
Starts its own lab (.fleetctl/bench-models-lab on 127.0.96.x) and takes it down at the end.

    .venv/bin/python bench/models_sync.py [--model-mb 2000] [--rate 50M] [--hosts 4,16] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import bench_model  # noqa: E402
from lab_support import LabHandle  # noqa: E402
from models_sync_profile import Sampler  # noqa: E402

from fleetctl.cli.models_sync import parse_rate  # noqa: E402
from fleetctl.lab import LabPaths, lab_down, lab_up  # noqa: E402
from fleetctl.transport.openssh import CIPHERS  # noqa: E402

LAB_DIR = REPO / ".fleetctl" / "bench-models-lab"
BASE = "127.0.96.0"
MODEL = "/srv/bench-model"
OUT = REPO / "bench" / "models_sync.md"


def give_peer_ssh(lab: LabHandle) -> None:
    known = lab.known_hosts.read_text()
    for name in lab.hosts:
        ssh_dir = LabPaths(lab.dir).host_dir(name) / "root" / ".ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh_dir / "id_ed25519").write_bytes(lab.key_path.read_bytes())
        (ssh_dir / "id_ed25519").chmod(0o600)
        (ssh_dir / "known_hosts").write_text(known)


def clear(lab: LabHandle, hosts: list[str]) -> None:
    for host in hosts:
        lab.ssh(host, f"rm -rf {MODEL} /srv/.bench-model.fleetctl-partial /srv/scp-model")


def scp_star(lab: LabHandle, hosts: list[str]) -> float:
    pushes = " ".join(f"scp -q -r {MODEL} root@{lab.addresses[h]}:/srv/scp-model &" for h in hosts)
    start = time.monotonic()
    lab.ssh("lab1", f"{pushes} wait", timeout=7200)
    return time.monotonic() - start


def sync(lab: LabHandle, hosts: list[str], sample: bool = False) -> tuple[float, int]:
    code = "import sys; from fleetctl.cli.main import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "-i", str(lab.inventory_path), "-l", ",".join(hosts), "models", "sync",
            MODEL, "--from", "lab1", "--json"]
    sshd = {h: pid for h, pid in lab.pids().items() if h in ["lab1", *hosts]}
    with Sampler(sshd, {}, every=1.0) if sample else contextlib.nullcontext() as sampler:
        start = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False,
                              env={**os.environ, "FLEETCTL_SSH_CONFIG": "none", "FLEETCTL_CONFIG": "none"})
        took = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"models sync failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")
    doc = json.loads(done.stdout)
    print(f"  sync to {len(hosts)}: {took:.1f}s, phases {doc['phases']}, load {os.getloadavg()[0]:.1f}", flush=True)
    if sampler is not None:
        kinds = {k: v for k, v in sampler.cpu_by_kind().items() if not k.startswith("lab")}
        print("  CPU s: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(kinds.items())), flush=True)
    return took, int(doc["source_bytes_sent"])


def profile(lab: LabHandle, counts: list[int], size: int) -> None:
    """One sync per host count under the sampler (models_sync_profile.py): CPU by process, hop rates."""
    targets = [h for h in lab.hosts if h != "lab1"]
    paths = LabPaths(lab.dir)
    probe = (f"ssh -v -T -o BatchMode=yes -o StrictHostKeyChecking=yes -o Ciphers={CIPHERS} "
             f"root@{lab.addresses[targets[0]]} true 2>&1 | grep -m1 'cipher:'; "
             f"ssh -v -T -o BatchMode=yes root@{lab.addresses[targets[0]]} true 2>&1 | grep -m1 'cipher:'")
    print("a hop's cipher, then scp's (ssh defaults):\n" + lab.ssh("lab1", probe, check=False).stdout, flush=True)
    for n in counts:
        hosts = targets[:n]
        clear(lab, hosts)
        dirs = {h: [paths.host_dir(h) / MODEL.strip("/"), paths.host_dir(h) / "srv" / ".bench-model.fleetctl-partial"]
                for h in hosts}
        sshd = {h: pid for h, pid in lab.pids().items() if h in ["lab1", *hosts]}
        with Sampler(sshd, dirs) as sampler:
            took, _ = sync(lab, hosts)
        cpu = sampler.cpu_by_kind()
        kinds = {k: v for k, v in cpu.items() if not k.startswith("lab")}
        print(f"N={n}: {took:.1f}s; CPU s by process: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(kinds.items())))
        print("  per host CPU s: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.items()) if k.startswith("lab")))
        print("  " + "\n  ".join(sampler.hops(size)))
        print("  MB/s per 2 s:\n  " + "\n  ".join(sampler.rates()), flush=True)
        clear(lab, hosts)


def run(lab: LabHandle, counts: list[int], args: argparse.Namespace, size: int
        ) -> dict[str, list[tuple[float, int]]]:
    """``args.runs`` rounds of a single copy and a sync per N; the star only at ``args.star_at`` in the
    first ``args.star_runs`` rounds (at 2 GB a star round is N single copies long)."""
    samples: dict[str, list[tuple[float, int]]] = {}
    targets = [h for h in lab.hosts if h != "lab1"]
    star_at = {int(n) for n in args.star_at.split(",") if n}
    for r in range(args.runs):
        clear(lab, targets)
        samples.setdefault("single copy", []).append((scp_star(lab, targets[:1]), size))
        print(f"round {r + 1}: single {samples['single copy'][-1][0]:.1f}s", flush=True)
        for n in counts:
            hosts = targets[:n]
            clear(lab, hosts)
            if n in star_at and r < args.star_runs:
                samples.setdefault(f"star N={n}", []).append((scp_star(lab, hosts), n * size))
                print(f"round {r + 1}: N={n} star {samples[f'star N={n}'][-1][0]:.1f}s", flush=True)
                clear(lab, hosts)
            samples.setdefault(f"sync N={n}", []).append(sync(lab, hosts, sample=args.sample))
            print(f"round {r + 1}: N={n} sync {samples[f'sync N={n}'][-1][0]:.1f}s", flush=True)
    clear(lab, targets)
    return samples


def report(samples: dict[str, list[tuple[float, int]]], args: argparse.Namespace, size: int, load: float) -> str:
    single = statistics.median(t for t, _ in samples["single copy"])
    rows = []
    for name, values in samples.items():
        t = statistics.median(s for s, _ in values)
        sent = statistics.median(b for _, b in values)
        rows.append(f"| {name} | {t:.1f} | {', '.join(f'{s:.1f}' for s, _ in values)} | {t / single:.2f}x | "
                    f"{sent / 1e6:,.0f} | {sent / size:.2f}x |")
    return "\n".join([
        f"# models sync vs the star and a single copy ({size / 1e6:,.0f} MB model: 4 shards + index)", "",
        f"Command: `.venv/bin/python bench/models_sync.py --model-mb {args.model_mb} --rate {args.rate} "
        f"--hosts {args.hosts} --runs {args.runs} --star-at {args.star_at} --star-runs {args.star_runs}` "
        f"(lab on {BASE[:-2]}.x, links capped at {args.rate}B/s each way "
        "per host by tc on loopback, 2-core machine)", "",
        "| what | median s | runs s | / single copy | MB the source sent | / model |",
        "|---|---|---|---|---|---|", *rows, "",
        "- single copy and star: `scp -r` run on lab1 (rsync is not installed here); star = N at once.",
        "- sync: `fleetctl models sync --from lab1`, whole command (manifest, checks, chain, verification).",
        f"- load average when the bench started: {load:.1f}. All hosts share this machine's 2 cores: every link",
        "  decrypts, hashes and re-encrypts, so at high N or rate the chain is CPU-bound here, not link-bound.", "",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-mb", type=int, default=2000)
    parser.add_argument("--rate", default="50M")
    parser.add_argument("--hosts", default="4,16")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="one sampled sync per N, nothing written")
    parser.add_argument("--star-at", default="4,16", help="the host counts the star runs at")
    parser.add_argument("--star-runs", type=int, default=3, help="the rounds the star runs in (the first ones)")
    parser.add_argument("--sample", action="store_true", help="print each sync's CPU seconds by process")
    parser.add_argument("--out", default=str(OUT), help="the markdown report's file")
    args = parser.parse_args()
    counts = sorted(int(n) for n in args.hosts.split(","))
    load = os.getloadavg()[0]
    lab = LabHandle.from_fleet(lab_up(1 + max(counts), LAB_DIR, BASE))
    try:
        give_peer_ssh(lab)
        seed = LabPaths(lab.dir).host_dir("lab1") / MODEL.strip("/")
        size = bench_model.write_model(seed, args.model_mb * 1_000_000, 4)
        with lab.links(parse_rate(args.rate)):
            if args.profile:
                profile(lab, counts, size)
                return 0
            samples = run(lab, counts, args, size)
    finally:
        lab_down(LAB_DIR, purge=True)
    text = report(samples, args, size, load)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
