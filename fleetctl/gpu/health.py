"""GPU health rules: pure functions over the parsed ``nvidia-smi -q -x`` facts (``smi.py``), the NVLink
state and the kernel log's Xids (``logs.py``). Each rule gives one check: green, amber or red,
with the value that decided it. Thresholds come from inventory variables (``Thresholds.from_vars``);
their defaults are written here and in the host variables reference. The CLI, the facts and the
playbook module only call ``evaluate``.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from fleetctl.errors import InputError
from fleetctl.gpu import hgx
from fleetctl.gpu.checks import Check as Check  # re-exported: callers import the verdict types from here
from fleetctl.gpu.checks import Level as Level
from fleetctl.gpu.checks import worst as worst
from fleetctl.gpu.logs import NvLink, XidEvent, pci_key
from fleetctl.gpu.smi import GpuFacts, GpuInfo


@dataclass(frozen=True)
class Thresholds:
    """Inventory variables (``gpu_*``), with their defaults; see the host variables reference."""

    ecc_correctable_max: int = 1000  # gpu_ecc_correctable_max: more correctable errors (volatile or aggregate): amber
    retired_pages_max: int = 10  # gpu_retired_pages_max: more retired pages (single + double bit): amber
    temp_margin_min: int = 5  # gpu_temp_margin_min: this close (C) to the slowdown temperature: amber
    pcie_width_min: int = 8  # gpu_pcie_width_min: fewer lanes than this: red (fewer than max: amber)
    pcie_gen_min: int = 3  # gpu_pcie_gen_min: a link below this generation (in P0/P1): red
    nvlink_errors_max: int = 100  # gpu_nvlink_errors_max: more NVLink error counts on a link: amber
    xid_since: float | None = None  # gpu_xid_since: Xids logged before this (Unix time or ISO date) are old
    xid_ignore: frozenset[int] = frozenset()  # gpu_xid_ignore: Xid numbers never counted
    gpus_expected: int | None = None  # gpus_expected (or gpus_per_host): GPU count other than this: red
    gpu_model: str | None = None  # gpu_model: a GPU whose name does not contain this (regex search): red
    nvlink_expected: bool | None = None  # gpu_nvlink_expected: every GPU pair NVLinked? None: from the model
    nvlink_per_pair: int | None = None  # gpu_nvlink_per_pair: NVLinks each pair must have; None: the usual count
    processes_allowed: tuple[str, ...] = ()  # gpu_processes_allowed: process names (globs) that may hold a GPU
    foreign_processes: str = "amber"  # gpu_foreign_processes: the level of a GPU held by another process
    mig_expected: bool = False  # gpu_mig_expected: MIG mode every GPU must be in (enabled or not)

    @classmethod
    def from_vars(cls, variables: Mapping[str, Any], host: str) -> Thresholds:
        """Read the thresholds from a host's variables; a bad value is one line naming host and var."""
        found: dict[str, Any] = {}
        for f in fields(cls):
            name = {"gpus_expected": "gpus_expected", "gpu_model": "gpu_model"}.get(f.name, f"gpu_{f.name}")
            value = variables.get(name)
            if value is None and f.name == "gpus_expected":
                name, value = "gpus_per_host", variables.get("gpus_per_host")
            if value is None or value == "":
                continue
            try:
                found[f.name] = _convert(f.name, value)
            except (TypeError, ValueError) as exc:
                raise InputError(f"host {host}: variable {name}: {exc}") from None
        return cls(**found)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["xid_ignore"] = sorted(self.xid_ignore)
        return out


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().lstrip("-").isdigit():
        raise ValueError(f"expected a whole number, got {value!r}")
    return int(value)


def _bool(value: Any) -> bool:
    text = str(value).strip().lower()
    if isinstance(value, bool) or text in ("true", "false", "yes", "no", "1", "0"):
        return value if isinstance(value, bool) else text in ("true", "yes", "1")
    raise ValueError(f"expected true or false, got {value!r}")


def _names(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else str(value).replace(",", " ").split()
    return tuple(str(v) for v in items if str(v))


def _level(value: Any) -> str:
    if str(value) not in ("amber", "red"):
        raise ValueError(f"expected amber or red, got {value!r}")
    return str(value)


_CONVERTERS = {"nvlink_expected": _bool, "mig_expected": _bool, "processes_allowed": _names,
               "foreign_processes": _level}


def _convert(name: str, value: Any) -> Any:
    if name in _CONVERTERS:
        return _CONVERTERS[name](value)
    if name == "gpu_model":
        text = str(value)
        try:
            re.compile(text)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc}): {text!r}") from None
        return text
    if name == "xid_ignore":
        items = value if isinstance(value, list) else str(value).replace(",", " ").split()
        return frozenset(_int(v) for v in items)
    if name == "xid_since":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, dt.datetime | dt.date):
            value = value.isoformat()
        try:
            when = dt.datetime.fromisoformat(str(value))
        except ValueError:
            raise ValueError(f"expected a Unix time or an ISO date such as 2026-12-01T08:00:00Z, "
                             f"got {value!r}") from None
        return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()
    return _int(value)


@dataclass
class GpuHealth:
    index: int | None  # None: the host's own checks (count, model, nvidia-smi itself)
    name: str
    uuid: str | None
    pci_bus_id: str | None
    checks: list[Check] = field(default_factory=list)

    @property
    def level(self) -> Level:
        return worst([c.level for c in self.checks])

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "uuid": self.uuid, "pci_bus_id": self.pci_bus_id,
                "level": self.level.value, "checks": [c.to_dict() for c in self.checks]}


@dataclass
class HostHealth:
    host: str
    gpus: list[GpuHealth]  # the host's own checks first (index None), then one per GPU
    thresholds: Thresholds

    @property
    def level(self) -> Level:
        return worst([g.level for g in self.gpus])

    def checks_at(self, level: Level) -> list[tuple[GpuHealth, Check]]:
        return [(g, c) for g in self.gpus for c in g.checks if c.level is level]

    def summary(self) -> str:
        """One line: "red: GPU 3 row_remapping (pending: yes); ..." or "green: 8 GPUs, 11 checks each"."""
        bad = self.checks_at(Level.RED) or self.checks_at(Level.AMBER)
        if not bad:
            n = len([g for g in self.gpus if g.index is not None])
            return f"green: {n} GPU{'s' if n != 1 else ''}, every check green"
        parts = [f"{'GPU ' + str(g.index) if g.index is not None else 'host'} {c.rule} ({c.value})" for g, c in bad]
        return f"{self.level.value}: " + "; ".join(parts[:4]) + (f" (+{len(parts) - 4} more)" if len(parts) > 4 else "")

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "level": self.level.value, "summary": self.summary(),
                "gpus": [g.to_dict() for g in self.gpus], "thresholds": self.thresholds.to_dict()}


# --- the rules, one GPU at a time ----------------------------------------------------------------

def _na(rule: str, gpu: GpuInfo | None = None) -> Check:
    if gpu is not None and gpu.readings.ecc_mode == "Disabled":
        return Check(rule, Level.GREEN, "n/a (ECC disabled)")
    return Check(rule, Level.GREEN, "n/a (not reported by this GPU)")


def ecc_uncorrectable(gpu: GpuInfo, t: Thresholds) -> Check:
    r = gpu.readings
    if r.ecc_volatile_uncorrectable is None and r.ecc_aggregate_uncorrectable is None:
        return _na("ecc_uncorrectable", gpu)
    bad = (r.ecc_volatile_uncorrectable or 0) > 0 or (r.ecc_aggregate_uncorrectable or 0) > 0
    return Check("ecc_uncorrectable", Level.RED if bad else Level.GREEN,
                 f"volatile {_n(r.ecc_volatile_uncorrectable)}, aggregate {_n(r.ecc_aggregate_uncorrectable)}")


def ecc_correctable(gpu: GpuInfo, t: Thresholds) -> Check:
    r = gpu.readings
    if r.ecc_volatile_correctable is None and r.ecc_aggregate_correctable is None:
        return _na("ecc_correctable", gpu)
    top = max(r.ecc_volatile_correctable or 0, r.ecc_aggregate_correctable or 0)
    return Check("ecc_correctable", Level.AMBER if top > t.ecc_correctable_max else Level.GREEN,
                 f"volatile {_n(r.ecc_volatile_correctable)}, aggregate {_n(r.ecc_aggregate_correctable)} "
                 f"(max {t.ecc_correctable_max})")


def row_remapping(gpu: GpuInfo, t: Thresholds) -> Check:
    r = gpu.readings
    if r.remap_pending is None and r.remap_failure is None:
        return _na("row_remapping")
    bad = bool(r.remap_pending) or bool(r.remap_failure)
    return Check("row_remapping", Level.RED if bad else Level.GREEN,
                 f"pending: {_yes(r.remap_pending)}, failure: {_yes(r.remap_failure)}, "
                 f"remapped {_n(r.remapped_correctable)} correctable / {_n(r.remapped_uncorrectable)} uncorrectable")


def retired_pages(gpu: GpuInfo, t: Thresholds) -> Check:
    r = gpu.readings
    if r.retired_single_bit is None and r.retired_double_bit is None and r.retired_pending is None:
        return _na("retired_pages")
    total = (r.retired_single_bit or 0) + (r.retired_double_bit or 0)
    bad = total > t.retired_pages_max or bool(r.retired_pending)
    return Check("retired_pages", Level.AMBER if bad else Level.GREEN,
                 f"{total} retired ({_n(r.retired_single_bit)} single-bit, {_n(r.retired_double_bit)} double-bit; "
                 f"max {t.retired_pages_max}), pending: {_yes(r.retired_pending)}")


def hw_slowdown(gpu: GpuInfo, t: Thresholds) -> Check:
    ev = gpu.readings.clock_events
    if not ev:
        return _na("hw_slowdown")
    active = [k for k in ("hw_thermal_slowdown", "hw_power_brake_slowdown", "hw_slowdown") if ev.get(k)]
    return Check("hw_slowdown", Level.RED if active else Level.GREEN,
                 "active: " + ", ".join(active) if active else "HW thermal slowdown and power brake not active")


def power_cap(gpu: GpuInfo, t: Thresholds) -> Check:
    r = gpu.readings
    if not r.clock_events:
        return _na("power_cap")
    draw = f"{r.power_draw_w:g} W" if r.power_draw_w is not None else "? W"
    limit = f"{r.power_limit_w:g} W" if r.power_limit_w is not None else "? W"
    active = bool(r.clock_events.get("sw_power_cap"))
    return Check("power_cap", Level.AMBER if active else Level.GREEN,
                 f"SW power cap {'active' if active else 'not active'} ({draw} of {limit})")


def temperature(gpu: GpuInfo, t: Thresholds) -> Check:
    r = gpu.readings
    if r.slowdown_margin_c is None:
        return _na("temperature")
    near = r.slowdown_margin_c <= t.temp_margin_min or bool(r.clock_events.get("sw_thermal_slowdown"))
    return Check("temperature", Level.AMBER if near else Level.GREEN,
                 f"{_n(r.temperature_c)} C, {r.slowdown_margin_c} C below slowdown (min {t.temp_margin_min})"
                 + (", SW thermal slowdown active" if r.clock_events.get("sw_thermal_slowdown") else ""))


def pcie_link(gpu: GpuInfo, t: Thresholds) -> Check:
    r = gpu.readings
    if r.pcie_width_current is None or r.pcie_width_max is None:
        return _na("pcie_link")
    value = f"Gen{_n(r.pcie_gen_current)} x{r.pcie_width_current} (max Gen{_n(r.pcie_gen_max)} x{r.pcie_width_max})"
    gen_low = r.pcie_gen_current is not None and r.pcie_gen_max is not None and r.pcie_gen_current < r.pcie_gen_max
    # In a power-saving state (P2 and below) a GPU lowers its link generation on purpose; never its width.
    saving = r.performance_state not in (None, "P0", "P1")
    gen_red = gen_low and not saving and r.pcie_gen_current is not None and r.pcie_gen_current < t.pcie_gen_min
    if r.pcie_width_current < t.pcie_width_min or gen_red:
        return Check("pcie_link", Level.RED, value + f" (red below x{t.pcie_width_min} or Gen{t.pcie_gen_min})")
    if r.pcie_width_current < r.pcie_width_max or (gen_low and not saving):
        return Check("pcie_link", Level.AMBER, value)
    return Check("pcie_link", Level.GREEN, value + (f" ({r.performance_state}: a power-saving state lowers the "
                                                    "link generation)" if gen_low else ""))


def nvlink(links: list[NvLink], error: str | None, t: Thresholds) -> Check:
    if error and not links:
        return Check("nvlink", Level.AMBER, f"unreadable: {error}")
    if not links:
        return Check("nvlink", Level.GREEN, "no NVLink")
    down = [lk.link for lk in links if not lk.active]
    if down:
        return Check("nvlink", Level.RED, f"{len(down)} of {len(links)} links down: {_list(down)}")
    noisy = {lk.link: sum(lk.errors.values()) for lk in links if sum(lk.errors.values()) > t.nvlink_errors_max}
    if noisy:
        shown = ", ".join(f"link {k}: {v}" for k, v in sorted(noisy.items()))
        return Check("nvlink", Level.AMBER, f"error counts above {t.nvlink_errors_max}: {shown}")
    return Check("nvlink", Level.GREEN, f"{len(links)} links up" + (f" ({error})" if error else ""))


def xid(events: list[XidEvent], log_error: str | None, t: Thresholds) -> Check:
    counted = [e for e in events if e.xid not in t.xid_ignore]
    new = [e for e in counted if t.xid_since is None or e.time is None or e.time >= t.xid_since]
    if new:
        last = {e.xid: e for e in new}
        shown = "; ".join(f"Xid {x}: {e.meaning}" + (f" (x{n})" if (n := sum(1 for v in new if v.xid == x)) > 1
                                                      else "") for x, e in sorted(last.items()))
        return Check("xid", Level.RED, shown)
    if log_error:
        return Check("xid", Level.AMBER, f"kernel log unreadable: {log_error}")
    old = len(counted) - len(new)
    return Check("xid", Level.GREEN, "no Xid this boot" if not events else
                 f"no new Xid ({old} before gpu_xid_since, {len(events) - len(counted)} ignored)")


GPU_RULES: tuple[Callable[[GpuInfo, Thresholds], Check], ...] = (
    ecc_uncorrectable, ecc_correctable, row_remapping, retired_pages, hw_slowdown, power_cap, temperature,
    pcie_link,
)


# --- the host ----------------------------------------------------------------------------------

def host_checks(facts: GpuFacts, t: Thresholds) -> list[Check]:
    out = []
    if facts.error:
        out.append(Check("nvidia_smi", Level.RED, facts.error))
    found = facts.count
    where = "" if facts.nvidia_smi else " (nvidia-smi not found)"
    if t.gpus_expected is None:
        out.append(Check("gpu_count", Level.GREEN, f"{found} GPU(s){where} (gpus_expected not set)"))
    else:
        level = Level.GREEN if found == t.gpus_expected else Level.RED
        out.append(Check("gpu_count", level, f"{found} GPU(s){where}, expected {t.gpus_expected}"))
    if t.gpu_model is not None and facts.gpus:
        other = sorted({g.name for g in facts.gpus if not re.search(t.gpu_model, g.name)})
        out.append(Check("gpu_model", Level.RED if other else Level.GREEN,
                         f"{', '.join(other)} (expected {t.gpu_model!r})" if other
                         else f"{facts.gpus[0].name} matches {t.gpu_model!r}"))
    if facts.gpus:
        out.append(hgx.topology(facts.topology, facts.topology_error, facts.count, [g.name for g in facts.gpus],
                                t.nvlink_expected, t.nvlink_per_pair))
    return out


def serving_checks(gpu: GpuInfo, facts: GpuFacts, t: Thresholds) -> list[Check]:
    """One GPU's fabric, the processes holding it, its persistence and MIG modes (``hgx.py``)."""
    return [hgx.fabric(gpu.fabric),
            hgx.processes(gpu.processes, facts.process_owners, t.processes_allowed, Level(t.foreign_processes)),
            hgx.persistence(gpu.persistence_mode), hgx.mig(gpu.mig_mode, gpu.mig_pending, t.mig_expected)]


def evaluate(facts: GpuFacts, t: Thresholds, host: str) -> HostHealth:
    """Every rule over one host's GPU facts."""
    report = HostHealth(host, [GpuHealth(None, "host", None, None, host_checks(facts, t))], t)
    log = facts.kernel_log
    events = log.xids if log else []
    by_pci = {pci_key(g.pci_bus_id): g.index for g in facts.gpus}
    unmatched = [e for e in events if by_pci.get(pci_key(e.pci)) is None]
    for gpu in facts.gpus:
        checks = [rule(gpu, t) for rule in GPU_RULES]
        checks.append(nvlink(facts.nvlink.get(gpu.index, []), facts.nvlink_error, t))
        mine = [e for e in events if pci_key(e.pci) is not None and by_pci.get(pci_key(e.pci)) == gpu.index]
        checks.append(xid(mine, log.error if log else None, t))
        checks.extend(serving_checks(gpu, facts, t))
        report.gpus.append(GpuHealth(gpu.index, gpu.name, gpu.uuid, gpu.pci_bus_id, checks))
    if unmatched:  # an Xid naming no GPU nvidia-smi lists (one that fell off the bus, say)
        report.gpus[0].checks.append(xid(unmatched, None, t))
    return report


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)


def _yes(value: bool | None) -> str:
    return "?" if value is None else "yes" if value else "no"


def _list(items: list[int]) -> str:
    return ", ".join(str(i) for i in items[:8]) + (f" (+{len(items) - 8})" if len(items) > 8 else "")
