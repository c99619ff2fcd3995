"""What a deploy (or a reconfigure, a rollback) did on one host: its outcome, the gates, what was pruned,
what the operator must see; the shape of ``deploy --json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetctl.release.gates import GateResult
from fleetctl.release.launch_check import LaunchCheck


@dataclass
class DeployResult:
    host: str
    release_id: str
    outcome: str  # planned | staged | deployed | reconfigured | unchanged | rolled-back | failed-no-previous
    #                | config-restored (a reconfiguration failed its gates: the configuration that served is back)
    previous: str | None = None
    build: dict[str, Any] = field(default_factory=dict)
    gates: list[GateResult] = field(default_factory=list)
    rollback_gates: list[GateResult] = field(default_factory=list)
    diffs: dict[str, str] = field(default_factory=dict)
    pruned: list[str] = field(default_factory=list)
    pruned_bases: list[str] = field(default_factory=list)  # base venvs built from a lock that went with them
    broke_lock: dict[str, Any] | None = None  # the stale lock's holder, when --break-lock broke one
    restart_error: str | None = None  # the restart after the switch failed (then switched back)
    launch: LaunchCheck | None = None  # the launch args as SGLang's own parser judged them
    rebuilt: str = ""  # why this host builds the release under another id (its base changed)
    staged: bool = False  # the build was staged earlier (release/stage.py): only switched, restarted, gated
    verified: int = 0  # state staged: the release's files checked against its manifest
    plan: str = ""  # deploy | reconfigure | unchanged (plan_switch): what check mode says and the run does
    changed: list[str] = field(default_factory=list)  # reconfigure: the host's configuration files rewritten
    models: list[dict[str, Any]] = field(default_factory=list)  # each model's state as the pre-switch check found it

    @property
    def note(self) -> str:
        """What the operator must see even when it went well (launch args not validated, a rebuild)."""
        launch = self.launch.detail if self.launch is not None and not self.launch.validated else ""
        return "; ".join(x for x in (self.rebuilt, launch) if x)

    @property
    def ok(self) -> bool:
        return self.outcome in ("planned", "deployed", "reconfigured", "unchanged", "staged")

    def failed_gate(self) -> GateResult | None:
        return next((g for g in self.gates if not g.ok), None)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("gates", "rollback_gates", "launch")}
        out["launch"] = self.launch.to_dict() if self.launch else None
        out["gates"] = [g.to_dict() for g in self.gates]
        out["rollback_gates"] = [g.to_dict() for g in self.rollback_gates]
        return out
