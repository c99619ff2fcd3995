"""Turn samples into bench/results.md and bench/results.json, and describe the machine."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def machine() -> dict[str, Any]:
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    ssh = ""
    try:
        ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(), "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "python": sys.version.split()[0], "kernel": platform.release(), "openssh": ssh,
    }


def stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _f(x: float) -> str:
    return f"{x:.3f}"


def fleet_table(samples: dict[str, dict[str, list[float]]]) -> list[str]:
    """samples[job][tool]; the tool 'openssh' is the lower bound the ratio is taken against."""
    lines = [_row(["job", "tool", "median s", "min", "max", "ratio to OpenSSH", "ratio to OpenSSH x25519"]),
             _row(["---", "---", "---:", "---:", "---:", "---:", "---:"])]
    for job, tools in samples.items():
        bases = [statistics.median(tools[b]) for b in ("openssh", "openssh-x25519")]
        for tool, xs in tools.items():
            s = stats(xs)
            ratios = [f"{s['median'] / b:.2f}" for b in bases]
            lines.append(_row([job, tool, _f(s["median"]), _f(s["min"]), _f(s["max"]), *ratios]))
    return lines


def agent_table(samples: dict[str, list[float]], ops: int) -> list[str]:
    lines = [_row(["measurement", "median s", "min", "max", "per op ms", "ratio to execs"]),
             _row(["---", "---:", "---:", "---:", "---:", "---:"])]
    base = statistics.median(samples["execs"])
    for name, xs in samples.items():
        s = stats(xs)
        batch = name in ("execs", "agent requests")
        label = f"{ops} {name}" if batch else name
        per_op = f"{s['median'] / ops * 1000:.2f}" if batch else ""
        ratio = f"{s['median'] / base:.3f}" if batch else ""
        lines.append(_row([label, _f(s["median"]), _f(s["min"]), _f(s["max"]), per_op, ratio]))
    return lines


def write(doc: dict[str, Any]) -> str:
    """Write results.json (raw samples) and results.md; return the markdown."""
    m = doc["machine"]
    md = [
        "# fleetctl benchmark", "",
        f"- date: {doc['date']}",
        f"- machine: {m['cpus']} CPUs (os.cpu_count()), {m['memory_gib']} GiB memory, Linux {m['kernel']}",
        f"- python {m['python']}; {m['openssh']}",
        f"- hosts: {', '.join(str(n) for n in doc['fleet'])} (lab sshd hosts on 127.0.90.x, this machine)",
        f"- {doc['runs']} runs per command after {doc['warmup']} warm-up, commands alternating within each round",
        f"- load average (1 min) before / after: {doc['load_before']:.2f} / {doc['load_after']:.2f}"
        " (anything else running on this machine shares its CPUs with the lab and both clients)",
        f"- reproduce: `{doc['command']}` (took {doc['elapsed_s']}s)", "",
        "Wall time of whole commands. `fleetctl` is `.venv/bin/fleetctl -i INV <cmd> --json` (a new process:",
        "imports, inventory, connect, agent start, the work, agent stop). `openssh` is the lower bound: one",
        "plain `ssh -F /dev/null -o StrictHostKeyChecking=yes ... HOST CMD` per host, all started at once.",
        "`ping` runs `/usr/bin/python3 -c 'import platform;print(platform.node())'` over ssh; `shell` runs",
        "`uname -r`. Ratio = median / OpenSSH median (<= 1.0: as fast as the lower bound).",
        "`openssh-x25519` adds `-o KexAlgorithms=curve25519-sha256`: the key exchange fleetctl's paramiko",
        "negotiates with these servers. Plain `openssh` uses OpenSSH's default, the post-quantum",
        "sntrup761x25519 exchange, which costs far more CPU per connection on this machine, so",
        "`openssh-x25519` is the like-for-like lower bound.", "",
    ]
    for count, samples in doc["fleet"].items():
        md += [f"## {count} hosts", "", *fleet_table(samples), ""]
    agent = doc["agent"]
    md += [
        "## The agent claim (in-process, one host, lab1)", "",
        f"{agent['ops']} small operations over one Fabric connection: {agent['ops']} execs of",
        f"`{agent['exec']}` (`SSHConnector.run`)",
        f"vs {agent['ops']} `AgentClient.call(\"selftest\", {{\"action\": \"echo\"}})` requests to one agent.",
        "Each round opens a fresh connection and agent;",
        "connecting and starting the agent (exec channel, hello, ping, first call shipping the module",
        "source) are timed apart and are not in the batch times.", "",
        *agent_table(agent["samples"], agent["ops"]), "",
    ]
    text = "\n".join(md)
    (HERE / "results.md").write_text(text)
    (HERE / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    return text
