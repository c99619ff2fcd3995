"""Links for the lab: each lab host's upload and download capped at a rate, so a transfer between lab
hosts is bound by "network" as on a real fleet (``fleetctl lab links --rate 50M``; tests and benches
through tests/lab_support.py).

The hosts share this machine's loopback, so the shaping is tc on ``lo``, per lab address:
- upload: an HTB class per host on lo's egress, chosen by source address. A lab host's own ssh
  binds its address (``BindAddress`` in the host's private /etc/ssh/ssh_config, set here), so what
  it sends carries it; the controller's own connections (127.0.0.1) stay unshaped.
- download: lo's ingress redirects packets for lab addresses to an ifb device of this lab, whose
  HTB class per host is chosen by destination address.
Traffic of other addresses is never classified (HTB's default 0 passes it straight through), so
other labs and the machine's own loopback traffic are untouched; each lab's filters sit at a
priority of their own and are removed with it. A host's traffic to itself (the delay relay's hop to
its sshd among it) never crosses its link and is passed unshaped. This kernel has no sch_netem:
latency, loss and partitions are nf_tables rules and a relay (fleetctl/lab/netfaults.py).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fleetctl.errors import LabError
from fleetctl.lab.state import LabPaths

ROOT = "1:"
MARK = "# fleetctl lab links"


@dataclass(frozen=True)
class LinkSpec:
    rate: float  # bytes per second, each way, per host


def tc(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which("tc") is None:
        raise LabError("lab links need tc (apt-get install iproute2)")
    done = subprocess.run(["tc", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise LabError(f"tc {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def lab_prio(addresses: list[str]) -> int:
    """The tc filter priority this lab's filters use (its own, so removal takes exactly them)."""
    o = [int(x) for x in addresses[0].split(".")]
    return max(1, (o[1] << 8 | o[2]) & 0xFFFF)


def class_minor(address: str) -> str:
    o = [int(x) for x in address.split(".")]
    return format(max(1, (o[2] << 8 | o[3]) & 0xFFFF), "x")


def ifb_name(directory: Path) -> str:
    return "ifb" + hashlib.sha256(str(directory).encode()).hexdigest()[:8]


def ensure_root(dev: str) -> None:
    shown = tc("qdisc", "show", "dev", dev).stdout
    if f"htb {ROOT} root" not in shown:
        tc("qdisc", "replace", "dev", dev, "root", "handle", ROOT, "htb", "r2q", "1000")


def add_class(dev: str, minor: str, rate: float) -> None:
    bits = f"{int(rate * 8)}bit"
    tc("class", "replace", "dev", dev, "parent", ROOT, "classid", f"1:{minor}", "htb", "rate", bits, "ceil", bits,
       "burst", "256k", "cburst", "256k", "quantum", "65536")


def match(dev: str, prio: int, field: str, address: str, flowid: str) -> None:
    tc("filter", "add", "dev", dev, "parent", ROOT, "protocol", "ip", "prio", str(prio), "u32",
       "match", "ip", field, f"{address}/32", "flowid", flowid)


def shape(directory: Path, addresses: dict[str, str], spec: LinkSpec) -> None:
    """Cap every lab host's upload and download at ``spec.rate`` (replacing what was set before)."""
    unshape(directory, addresses)
    prio, ifb = lab_prio(list(addresses.values())), ifb_name(directory)
    ensure_root("lo")
    if ip("link", "show", ifb, check=False).returncode != 0:
        ip("link", "add", ifb, "type", "ifb")
    ip("link", "set", ifb, "up")
    ensure_root(ifb)
    if "ingress" not in tc("qdisc", "show", "dev", "lo", "ingress").stdout:
        tc("qdisc", "add", "dev", "lo", "handle", "ffff:", "ingress")
    for name, address in addresses.items():
        minor = class_minor(address)
        add_class("lo", minor, spec.rate)
        add_class(ifb, minor, spec.rate)
        for dev in ("lo", ifb):  # the host to itself first, unshaped (1:0: HTB's direct queue)
            tc("filter", "add", "dev", dev, "parent", ROOT, "protocol", "ip", "prio", str(prio), "u32",
               "match", "ip", "src", f"{address}/32", "match", "ip", "dst", f"{address}/32", "flowid", "1:0")
        match("lo", prio, "src", address, f"1:{minor}")
        match(ifb, prio, "dst", address, f"1:{minor}")
        tc("filter", "add", "dev", "lo", "parent", "ffff:", "protocol", "ip", "prio", str(prio), "u32",
           "match", "ip", "dst", f"{address}/32", "action", "mirred", "egress", "redirect", "dev", ifb)
        bind_ssh(directory, name, address)


def unshape(directory: Path, addresses: dict[str, str]) -> None:
    """Remove this lab's classes, filters and ifb device; other labs' stay."""
    if shutil.which("tc") is None:
        return
    prio = str(lab_prio(list(addresses.values())))
    tc("filter", "del", "dev", "lo", "parent", ROOT, "prio", prio, check=False)
    tc("filter", "del", "dev", "lo", "parent", "ffff:", "prio", prio, check=False)
    for name, address in addresses.items():
        tc("class", "del", "dev", "lo", "classid", f"1:{class_minor(address)}", check=False)
        unbind_ssh(directory, name)
    ip("link", "del", ifb_name(directory), check=False)
    # The last lab to stop shaping removes the qdiscs it added (ours: an HTB 1: root; never another kind).
    ours = f"htb {ROOT} root" in tc("qdisc", "show", "dev", "lo", check=False).stdout
    if ours and "class htb" not in tc("class", "show", "dev", "lo", check=False).stdout:
        tc("qdisc", "del", "dev", "lo", "root", check=False)
        if not tc("filter", "show", "dev", "lo", "parent", "ffff:", check=False).stdout.strip():
            tc("qdisc", "del", "dev", "lo", "ingress", check=False)


def ssh_config(directory: Path, name: str) -> Path:
    return LabPaths(directory).host_dir(name) / "etc" / "ssh" / "ssh_config"


def bind_ssh(directory: Path, name: str, address: str) -> None:
    """The host's own ssh sends from its lab address (what the upload class matches)."""
    path = ssh_config(directory, name)
    if not path.parent.is_dir():
        return
    text = path.read_text() if path.exists() else ""
    path.write_text(f"{MARK}\nBindAddress {address}\n{MARK} end\n" + text)


def unbind_ssh(directory: Path, name: str) -> None:
    path = ssh_config(directory, name)
    if not path.exists():
        return
    text = path.read_text()
    start, end = text.find(f"{MARK}\n"), text.find(f"{MARK} end\n")
    if start >= 0 and end > start:
        path.write_text(text[:start] + text[end + len(f"{MARK} end\n"):])
