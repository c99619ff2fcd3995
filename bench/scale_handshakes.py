"""Fresh `fleetctl ping` on bench/scale.py's lab (kept up with --keep-lab) under variants of the
environment (FLEETCTL_HANDSHAKES, FLEETCTL_WORKERS), alternating round by round: wall time, the
whole process tree's user and system CPU and voluntary / involuntary context switches (getrusage of
the reaped children: fleetctl reaps its workers), the hosts' CPU (the bench's cgroup meter) and the
most threads the tree had (sampled from /proc). Issue 37: what grows per host from 200 to 1,000.

    .venv/bin/python bench/scale_handshakes.py N ROUNDS NAME:FORKS:ENV=V,ENV=V ...
    e.g. ... 1000 2 h0:1000:FLEETCTL_HANDSHAKES=0 h16:1000: w16:1000:FLEETCTL_HANDSHAKES=0,FLEETCTL_WORKERS=16
"""
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
import run, jobs, scale  # noqa
from fleetctl.lab import lab_up  # noqa

n, rounds = int(sys.argv[1]), int(sys.argv[2])
variants = []
for spec in sys.argv[3:]:
    name, forks, envs = (spec.split(":") + [""])[:3]
    env = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
    variants.append((name, int(forks), env))
fleet = lab_up(int(os.environ.get("LABN", "1000")), scale.LAB_DIR, scale.BASE)
inv = scale.sub_inventory(fleet, n)
meter, group = run.host_cpu_meter(fleet)

def threads_of_tree(pid, peak):
    while True:
        try:
            kids = [k for t in os.listdir(f"/proc/{pid}/task")
                    for k in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
            tot = 0
            for p in [pid, *map(int, kids)]:
                tot += len(os.listdir(f"/proc/{p}/task"))
            peak[0], peak[1] = max(peak[0], tot), max(peak[1], len(kids))
        except OSError:
            return
        time.sleep(0.2)

def one(forks, env):
    argv = [str(jobs.FLEETCTL), "-i", str(inv), "-f", str(forks), "-e", "ansible_timeout=60", "ping", "--json"]
    jobs.settle(meter)
    h0 = meter()
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env})
    peak = [0, 0]
    threading.Thread(target=threads_of_tree, args=(p.pid, peak), daemon=True).start()
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    jobs.settle(meter)
    return p, out, err, wall, meter() - h0, peak

results = {name: [] for name, _, _ in variants}
for r in range(rounds):
    for name, forks, env in variants:
        load = os.getloadavg()[0]
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p, out, err, wall, hcpu, peak = one(forks, env)
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            summ = json.loads(out)["summary"]
        except Exception:
            summ = {"bad": out[-300:].decode(errors="replace"), "err": err[-300:].decode(errors="replace")}
        row = {"round": r, "rc": p.returncode, "wall": round(wall, 2), "load": round(load, 1),
               "user_ms_h": round((ru.ru_utime - ru0.ru_utime) * 1000 / n, 2),
               "sys_ms_h": round((ru.ru_stime - ru0.ru_stime) * 1000 / n, 2),
               "vcsw_h": round((ru.ru_nvcsw - ru0.ru_nvcsw) / n, 1),
               "ivcsw_h": round((ru.ru_nivcsw - ru0.ru_nivcsw) / n, 1),
               "hosts_ms_h": round(hcpu * 1000 / n, 1), "threads_peak": peak[0], "workers": peak[1],
               "summary": summ}
        results[name].append(row)
        print(n, name, json.dumps(row), flush=True)
run.remove_cgroups()
