"""Rules that matter most on an HGX serving host (pure): the NVLink topology between every GPU pair
(``topo -m``), each GPU's fabric registration, processes that are not the release's server holding
a GPU, and the persistence and MIG modes. ``health.evaluate`` calls them with the host's
thresholds."""

from __future__ import annotations

import fnmatch
import re
from collections import Counter

from fleetctl.gpu.checks import Check, Level
from fleetctl.gpu.topo import TopoMatrix, nvlink_count
from fleetctl.gpu.xml_sections import Fabric, GpuProcess, ProcessOwners

# GPUs whose boards join every GPU pair by NVLink through NVSwitch (HGX/DGX SXM and NVL boards),
# as nvidia-smi names them. The PCIe cards (H100 PCIe, H100 NVL, H200 NVL: bridges at most) are not.
NVLINK_BOARDS = re.compile(r"H100 80GB HBM3|H100 SXM|H800(?! PCIe)|H200(?! NVL)|\bH20\b|B100|B200|B300|GB200|GB300|"
                           r"A100-SXM|A800-SXM")


def nvlink_expected(names: list[str], setting: bool | None) -> tuple[bool, str]:
    """(expected?, why): the host var when set, else every GPU's model is an NVSwitch board's."""
    if setting is not None:
        return setting, f"gpu_nvlink_expected: {str(setting).lower()}"
    if names and all(NVLINK_BOARDS.search(n) for n in names):
        return True, f"{names[0]} is an NVSwitch board"
    return False, "not an NVSwitch board (set gpu_nvlink_expected to check)"


def topology(topo: TopoMatrix | None, error: str | None, gpus: int, names: list[str],
             expected: bool | None, per_pair: int | None) -> Check:
    """Every GPU pair joined by the same number of NVLinks, where NVLink is expected."""
    if gpus < 2:
        return Check("topology", Level.GREEN, f"{gpus} GPU: no pair to connect")
    if topo is None:
        return Check("topology", Level.AMBER, f"unreadable: {error or 'nvidia-smi topo -m was not run'}")
    pairs = [(a, b) for i, a in enumerate(topo.gpus) for b in topo.gpus[i + 1:]]
    cells = {(a, b): topo.link(a, b) or "?" for a, b in pairs}
    kinds = ", ".join(f"{n} {k}" for k, n in Counter(cells.values()).most_common())
    want, why = nvlink_expected(names, expected)
    if not want:
        return Check("topology", Level.GREEN, f"{len(pairs)} GPU pairs: {kinds} ({why})")
    counts = Counter(c for c in (nvlink_count(v) for v in cells.values()) if c is not None)
    target = per_pair if per_pair is not None else (counts.most_common(1)[0][0] if counts else None)
    bad = [(a, b, cell) for (a, b), cell in cells.items() if nvlink_count(cell) != target or target is None]
    if len(topo.gpus) != gpus:
        return Check("topology", Level.RED, f"topo -m lists {len(topo.gpus)} GPUs, nvidia-smi {gpus}")
    if bad:
        shown = "; ".join(f"GPU{a}-GPU{b}: {cell}" for a, b, cell in bad[:6]) + (
            f" (+{len(bad) - 6} more)" if len(bad) > 6 else "")
        return Check("topology", Level.RED, f"{len(bad)} of {len(pairs)} GPU pairs not NV{target or '#'}: "
                                            f"{shown} ({why})")
    return Check("topology", Level.GREEN, f"all {len(pairs)} GPU pairs NV{target} ({why})")


def fabric(fab: Fabric) -> Check:
    """The GPU's registration with the NVLink fabric: Completed with Success, and healthy."""
    if not fab.present:
        return Check("fabric", Level.GREEN, "n/a (no NVLink fabric on this GPU)")
    ids = f"clique {fab.clique_id or '?'}, cluster {fab.cluster_uuid or '?'}"
    if fab.state != "Completed":
        return Check("fabric", Level.RED, f"state {fab.state} (status {fab.status or 'N/A'}): not registered with "
                                          "the fabric (is nvidia-fabricmanager running?)")
    if fab.status != "Success":
        return Check("fabric", Level.RED, f"state Completed, status {fab.status or 'N/A'} ({ids})")
    health = f"health {fab.health_summary or 'N/A'}, bandwidth {fab.bandwidth or 'N/A'}"
    if (fab.health_summary or "").lower() == "unhealthy":
        return Check("fabric", Level.RED, f"Completed, Success but {health} ({ids})")
    degraded = (fab.bandwidth or "").lower() == "degraded" or (fab.health_summary or "").lower() == "limited capacity"
    return Check("fabric", Level.AMBER if degraded else Level.GREEN, f"Completed, Success, {health} ({ids})")


def _mib(procs: list[GpuProcess]) -> str:
    known = [p.used_memory_mib for p in procs if p.used_memory_mib is not None]
    return f"{sum(known)} MiB" if known else "memory N/A"


def processes(procs: list[GpuProcess], owners: ProcessOwners | None, allowed: tuple[str, ...],
              level: Level) -> Check:
    """Processes holding the GPU that are neither the release's server nor allowed by name."""
    if not procs:
        return Check("processes", Level.GREEN, "no process")
    owners = owners or ProcessOwners()
    mine = [p for p in procs if owners.of_release(p.pid)]
    named = [p for p in procs if p not in mine and _allowed(p.name, allowed)]
    other = [p for p in procs if p not in mine and p not in named]
    parts = [f"{len(mine)} of the release's server ({_mib(mine)})"] if mine else []
    if named:
        parts.append(f"{len(named)} allowed by gpu_processes_allowed ({_mib(named)})")
    if not other:
        return Check("processes", Level.GREEN, "; ".join(parts))
    shown = ", ".join(f"pid {p.pid} {p.name} ({p.type or '?'}, "
                      f"{'N/A' if p.used_memory_mib is None else str(p.used_memory_mib) + ' MiB'}"
                      f"{', not in this pid namespace' if p.pid in owners.hidden else ''})" for p in other[:4])
    more = f" (+{len(other) - 4} more)" if len(other) > 4 else ""
    return Check("processes", level, f"{_mib(other)} held by {len(other)} other process"
                                     f"{'es' if len(other) > 1 else ''}: {shown}{more}"
                                     + ("; " + "; ".join(parts) if parts else ""))


def _allowed(name: str, patterns: tuple[str, ...]) -> bool:
    base = name.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(base, p) for p in patterns)


def persistence(enabled: bool | None) -> Check:
    if enabled is None:
        return Check("persistence", Level.GREEN, "n/a (not reported by this GPU)")
    if enabled:
        return Check("persistence", Level.GREEN, "Enabled")
    return Check("persistence", Level.AMBER, "Disabled: the driver tears the GPU down when its last client "
                                             "exits (slow starts; nvidia-persistenced or nvidia-smi -pm 1)")


def mig(current: str | None, pending: str | None, expected: bool) -> Check:
    """MIG as the host expects it (off for a server using whole GPUs), with no change pending."""
    if current is None:
        return Check("mig", Level.GREEN, "n/a (no MIG on this GPU)")
    want = "Enabled" if expected else "Disabled"
    if current != want:
        return Check("mig", Level.RED, f"{current}, expected {want} (gpu_mig_expected: {str(expected).lower()})")
    if pending is not None and pending != current:
        return Check("mig", Level.AMBER, f"{current}, {pending} pending: a GPU reset or reboot will change it")
    return Check("mig", Level.GREEN, current)
