"""`fleetctl models status` (the quick tier) and `models verify --full` on a 16-shard model, beside `sha256sum`.

Each lab host holds the same test model (16 safetensors shards + index + config, --model-mb in all) with its
manifest beside it. Warm: one untimed run of each first (page cache full, the host's Python started once).
- quick: `fleetctl models status MODEL -l HOST --json`, whole command, per host and for all hosts at once;
- full: `fleetctl models verify --full MODEL -l HOST --json`, whole command, in MB/s of the model's bytes;
- sha256sum: `sha256sum` of the same files on the same host (over ssh, as fleetctl reaches it), in MB/s.
Medians of --runs rounds. Starts its own lab (.fleetctl/bench-models-verify-lab on 127.0.97.x) and takes it
down at the end.

    .venv/bin/python bench/models_verify.py [--model-mb 512] [--hosts 2] [--runs 5]
"""

from __future__ import annotations

import argparse
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

from fleetctl.lab import LabPaths, lab_down, lab_up  # noqa: E402
from fleetctl.models import manifest as mf  # noqa: E402

LAB_DIR = REPO / ".fleetctl" / "bench-models-verify-lab"
BASE = "127.0.97.0"
MODEL = "/srv/bench-model"
SHARDS = 16
OUT = REPO / "bench" / "models_verify.md"


def write_model(folder: Path, total: int) -> int:
    """16 safetensors shards, the index, a config and the manifest; the bytes of the model."""
    bench_model.write_model(folder, total, SHARDS)
    mf.dump(mf.build_from_folder(str(folder)), mf.manifest_path("folder", str(folder)))
    return sum(p.stat().st_size for p in folder.iterdir() if p.name != mf.FOLDER_MANIFEST)


def fleetctl(lab: LabHandle, hosts: list[str], *args: str) -> float:
    code = "import sys; from fleetctl.cli.main import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "-i", str(lab.inventory_path), "-l", ",".join(hosts), "models", *args,
            MODEL, "--json"]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False,
                          env={**os.environ, "FLEETCTL_SSH_CONFIG": "none", "FLEETCTL_CONFIG": "none"})
    took = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"models {' '.join(args)} failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr}")
    if "--full" in args:  # every byte was hashed, not taken from the verified-hash store
        for host in hosts:
            (state,) = json.loads(done.stdout)["hosts"][host]["value"]
            if state["hashed_bytes"] != state["bytes"]:
                raise SystemExit(f"{host}: --full hashed {state['hashed_bytes']} of {state['bytes']} B")
    return took


def sha256sum(lab: LabHandle, host: str) -> float:
    start = time.monotonic()
    lab.ssh(host, f"sha256sum {MODEL}/*.safetensors {MODEL}/*.json >/dev/null", timeout=3600)
    return time.monotonic() - start


def measure(lab: LabHandle, runs: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    hosts = list(lab.hosts)
    fleetctl(lab, hosts, "status")  # warm
    fleetctl(lab, hosts, "verify", "--full")
    sha256sum(lab, hosts[0])
    for r in range(runs):
        for host in hosts:
            samples.setdefault("quick, one host", []).append(fleetctl(lab, [host], "status"))
        samples.setdefault(f"quick, {len(hosts)} hosts at once", []).append(fleetctl(lab, hosts, "status"))
        samples.setdefault("full, one host", []).append(fleetctl(lab, [hosts[0]], "verify", "--full"))
        samples.setdefault("sha256sum, one host", []).append(sha256sum(lab, hosts[0]))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in samples.items()), flush=True)
    return samples


def report(samples: dict[str, list[float]], args: argparse.Namespace, size: int, load: float) -> str:
    rows = []
    for name, values in samples.items():
        t = statistics.median(values)
        rate = f"{size / t / 1e6:,.0f}" if not name.startswith("quick") else ""
        rows.append(f"| {name} | {t:.2f} | {', '.join(f'{v:.2f}' for v in values)} | {rate} |")
    full = statistics.median(samples["full, one host"])
    plain = statistics.median(samples["sha256sum, one host"])
    return "\n".join([
        f"# models verify: quick and full on a {SHARDS}-shard model ({size / 1e6:,.0f} MB)", "",
        f"Command: `.venv/bin/python bench/models_verify.py --model-mb {args.model_mb} --hosts {args.hosts} "
        f"--runs {args.runs}` (lab on {BASE[:-2]}.x, 2-core machine shared with other work: load average "
        f"{load:.1f} when it started)", "",
        "| what | median s | runs s | MB/s |", "|---|---|---|---|", *rows, "",
        f"- full: `models verify --full` at {size / full / 1e6:,.0f} MB/s, `sha256sum` of the same files at "
        f"{size / plain / 1e6:,.0f} MB/s: {plain / full:.2f}x its speed, the whole command (ssh, the agent) included.",
        "- Warm page cache: both read from memory, so this is this CPU's hash speed, not the disk's. Python's "
        "hashlib",
        "  (OpenSSL 3, which likely uses the CPU's SHA-NI) beats coreutils' sha256sum here. `--full` is checked to",
        "  hash every byte (its hashed_bytes equal the model's bytes).",
        "- quick: `models status` (sizes, symlinks, every safetensors header, the index's weight map), whole",
        "  command: connecting, shipping the host module, the answer; warm (page cache, known hosts).", "",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-mb", type=int, default=512)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    lab = LabHandle.from_fleet(lab_up(args.hosts, LAB_DIR, BASE))
    try:
        size = 0
        for host in lab.hosts:
            size = write_model(LabPaths(lab.dir).host_dir(host) / MODEL.strip("/"), args.model_mb * 1_000_000)
        samples = measure(lab, args.runs)
    finally:
        lab_down(LAB_DIR, purge=True)
    text = report(samples, args, size, load)
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
