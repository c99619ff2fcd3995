"""Faults on the lab's links: a host's latency, packet loss, or a partition (``fleetctl lab links
--delay/--loss/--partition``; the rate is tc's, fleetctl/lab/links.py).

This kernel has no sch_netem, so these are made with nf_tables, in one table of the lab's own
(``fleetctl_lab_<hash of its folder>``, replaced whole at each change, deleted by ``links --off`` and
``lab down``; no other table is read or touched). Its rules match only the lab's own addresses:
- loss: a packet to or from the host is dropped with the given probability (``numgen random``), so a
  host's link loses that share each way; two lossy hosts' packets to each other cross both links;
- partition: every packet to or from the host is dropped (silence, as a pulled cable: nothing is
  refused, connections hang until their own timeouts);
- delay: no qdisc can do it here, so a relay process per host (fleetctl/lab/relay.py) holds each
  chunk that long, each way, and a DNAT rule sends new connections to the host's ssh port (22, what
  fleetctl and host-to-host copies use) through it. Connections open before the delay was set keep
  their old path; other ports of the host are not delayed.
A host's traffic to itself (the relay's own hop among it) never crosses its link and is let through.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetctl.errors import LabError

SSH_PORT = 22


@dataclass(frozen=True)
class Fault:
    delay_ms: float = 0.0  # held this long each way (ssh port)
    loss_pct: float = 0.0  # share of packets dropped each way
    partition: bool = False  # every packet dropped

    def __bool__(self) -> bool:
        return bool(self.delay_ms or self.loss_pct or self.partition)


@dataclass
class HostLink:
    fault: Fault
    relay_pid: int = 0
    relay_port: int = 0


def table_name(directory: Path) -> str:
    """The lab's own table: named by its folder's absolute path (however the folder was given)."""
    return "fleetctl_lab_" + hashlib.sha256(str(Path(directory).resolve()).encode()).hexdigest()[:10]


def state_path(directory: Path) -> Path:
    return directory / "links.json"


def require_nft() -> None:
    if shutil.which("nft") is None:
        raise LabError("lab links need nft for delay, loss and partitions (apt-get install nftables)")


def nft(script: str) -> None:
    require_nft()
    done = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LabError(f"nft: {done.stderr.strip() or done.stdout.strip()}")


def load(directory: Path) -> dict[str, HostLink]:
    try:
        raw = json.loads(state_path(directory).read_text())
    except (OSError, ValueError):
        return {}
    return {name: HostLink(Fault(**entry["fault"]), entry["relay_pid"], entry["relay_port"])
            for name, entry in raw.items()}


def save(directory: Path, links: dict[str, HostLink]) -> None:
    raw = {name: {"fault": asdict(link.fault), "relay_pid": link.relay_pid, "relay_port": link.relay_port}
           for name, link in links.items()}
    state_path(directory).write_text(json.dumps(raw, indent=1) + "\n")


def set_faults(directory: Path, addresses: dict[str, str], faults: dict[str, Fault]) -> None:
    """Give the named hosts these faults (Fault(): none); the other hosts keep theirs."""
    require_nft()
    links = load(directory)
    try:
        for name, fault in faults.items():
            old = links.pop(name, HostLink(Fault()))
            if old.fault.delay_ms == fault.delay_ms and (not fault.delay_ms or is_relay(old.relay_pid)):
                link = HostLink(fault, old.relay_pid, old.relay_port)
            else:
                stop_relay(old.relay_pid)
                link = HostLink(fault)
                if fault.delay_ms:
                    link.relay_pid, link.relay_port = start_relay(addresses[name], fault.delay_ms)
            if link.fault:
                links[name] = link
        nft(ruleset(table_name(directory), addresses, links))
    finally:
        save(directory, links)


def clear(directory: Path) -> None:
    """Remove this lab's table and stop its relays (nothing else is touched)."""
    for link in load(directory).values():
        stop_relay(link.relay_pid)
    state_path(directory).unlink(missing_ok=True)
    if shutil.which("nft") is not None:
        table = table_name(directory)
        subprocess.run(["nft", "-f", "-"], input=f"table ip {table}\ndelete table ip {table}\n",
                       capture_output=True, text=True, check=False)


def ruleset(table: str, addresses: dict[str, str], links: dict[str, HostLink]) -> str:
    """The lab's whole table, replacing what was there in one transaction."""
    drops, nats = [], []
    for name, link in sorted(links.items()):
        ip, fault = addresses[name], link.fault
        drops.append(f"ip saddr {ip} ip daddr {ip} accept")  # the host to itself: not over its link
        if fault.partition:
            drops += [f"ip daddr {ip} counter drop", f"ip saddr {ip} counter drop"]
        elif fault.loss_pct:
            share = round(fault.loss_pct * 100)  # in hundredths of a percent
            drops += [f"ip {end} {ip} numgen random mod 10000 < {share} counter drop" for end in ("daddr", "saddr")]
        if link.relay_port:
            nats.append(f"ip daddr {ip} tcp dport {SSH_PORT} ip saddr != {ip} dnat to {ip}:{link.relay_port}")
    body = ["  chain links_out {", "    type filter hook output priority 0; policy accept;",
            *(f"    {rule}" for rule in drops), "  }"]
    if nats:
        body += ["  chain links_nat {", "    type nat hook output priority -100; policy accept;",
                 *(f"    {rule}" for rule in nats), "  }"]
        # A packet the rate's ifb hands back to lo has lost its conntrack entry: tracked again on the
        # way in, it would clash with its DNATed connection and be dropped. It was NATed on the way
        # out already; packets that kept their entry (no rate) are left alone by notrack.
        ours = " ".join(sorted(addresses.values()))
        body += ["  chain links_raw {", "    type filter hook prerouting priority -300; policy accept;",
                 f"    ip daddr {{ {ours.replace(' ', ', ')} }} notrack",
                 f"    ip saddr {{ {ours.replace(' ', ', ')} }} notrack", "  }"]
    return f"table ip {table}\ndelete table ip {table}\ntable ip {table} {{\n" + "\n".join(body) + "\n}\n"


def start_relay(address: str, delay_ms: float) -> tuple[int, int]:
    """A delaying relay in front of ``address``'s ssh port: (its pid, the port it listens on)."""
    done = subprocess.run([sys.executable, "-m", "fleetctl.lab.relay", address, str(SSH_PORT), str(delay_ms)],
                          capture_output=True, text=True, check=False, timeout=60)
    try:
        pid, port = (int(word) for word in done.stdout.split())
    except ValueError:
        raise LabError(f"the delay relay for {address} did not start: {done.stderr.strip()[-300:]}") from None
    return pid, port


def is_relay(pid: int) -> bool:
    """Whether ``pid`` is a running relay (by its command line: a reused pid is not)."""
    try:
        return bool(pid) and b"fleetctl.lab.relay" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_relay(pid: int) -> None:
    """End a relay this module started (a pid reused since is left alone)."""
    try:
        if is_relay(pid):
            os.kill(pid, signal.SIGTERM)
    except OSError:
        pass


def dropped(directory: Path) -> dict[str, int]:
    """Packets the lab's loss and partition rules dropped so far, per address (to and from it)."""
    shown = subprocess.run(["nft", "list", "table", "ip", table_name(directory)], capture_output=True, text=True,
                           check=False).stdout
    counts: dict[str, int] = {}
    for found in re.finditer(r"ip [ds]addr (\S+) .*counter packets (\d+)", shown):
        counts[found[1]] = counts.get(found[1], 0) + int(found[2])
    return counts
