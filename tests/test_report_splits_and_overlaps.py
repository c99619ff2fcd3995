"""`report` on a group split across releases and on overlapping runs (issue 32 P3, P4): a host off its
group's release is amber with every release's hosts named (not "all green"); groups with children may
differ on purpose and are judged through their children; each host's last run is the run that acted
on it last, not the one that started last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import report_support as rs

from fleetctl.gpu.health import Thresholds
from fleetctl.report import data as report_data
from fleetctl.report import fleet as report
from fleetctl.report.runs import view


def fleet(tmp: Path, releases: dict[str, str], groups: dict[str, list[str]],
          split_groups: tuple[str, ...] | None = None, runs: list[Any] | None = None) -> report_data.Gathered:
    hosts = {n: rs.host(n, current=rid) for n, rid in sorted(releases.items())}
    request = report_data.ReportRequest({n: Thresholds(gpus_expected=1, gpu_model="H200") for n in hosts}, groups,
                                        tmp, split_groups=split_groups)
    return report_data.Gathered(request, hosts, report_data.audit(hosts, request), runs or [])


def test_a_host_off_its_groups_release_is_amber_and_named(tmp_path: Path) -> None:
    releases = {"lab1": "opt-1", "lab2": "opt-1", "lab3": "opt-1", "lab4": "slow-2"}
    doc = report.build(fleet(tmp_path, releases, dict.fromkeys(releases, ["lab"])), now=rs.NOW)
    rows = {r["host"]: r for r in doc["hosts"]}
    line = "group lab runs 2 releases: opt-1 on lab1, lab2, lab3; slow-2 on lab4"
    assert rows["lab4"]["level"] == "amber" and rows["lab4"]["problems"] == [f"release split: {line}"]
    assert [rows[h]["level"] for h in ("lab1", "lab2", "lab3")] == ["green"] * 3
    assert doc["summary"]["line"] == "4 hosts: 0 red, 1 amber, 3 green"
    assert doc["splits"] == [{"group": "lab", "releases": {"opt-1": ["lab1", "lab2", "lab3"], "slow-2": ["lab4"]}}]
    assert "release split in group lab: opt-1 on lab1, lab2, lab3; slow-2 on lab4" in doc["notes"]


def test_an_even_split_flags_every_host_and_parent_groups_may_differ(tmp_path: Path) -> None:
    releases = {"a1": "x-1", "a2": "y-2", "b1": "z-3", "b2": "z-3"}
    groups = {"a1": ["gpu", "h200"], "a2": ["gpu", "h200"], "b1": ["gpu", "b200"], "b2": ["gpu", "b200"]}
    doc = report.build(fleet(tmp_path, releases, groups, split_groups=("h200", "b200")), now=rs.NOW)
    rows = {r["host"]: r for r in doc["hosts"]}
    assert {h: rows[h]["level"] for h in releases} == {"a1": "amber", "a2": "amber", "b1": "green", "b2": "green"}
    assert [s["group"] for s in doc["splits"]] == ["h200"]  # gpu's children run different releases on purpose


def test_the_last_run_per_host_is_the_one_that_acted_last(tmp_path: Path) -> None:
    """A starts first over lab3-lab4 with a slow canary; B starts 1.5 s later on lab4 and is done at
    5 s; A switches lab4 at 17 s. lab4's last run is A, lab3's too."""
    def ev(ts: float, kind: str, **f: Any) -> dict[str, Any]:
        return {"ts": rs.T0 + ts, "event": kind, **f}

    def deployed(ts: float, host: str) -> list[dict[str, Any]]:
        return [ev(ts, "task_result", play=0, task=0, name="deploy", host=host, status="changed", changed=True),
                ev(ts, "host_done", play=0, host=host, status="ok")]

    a = [ev(0, "run_start", playbook="deploy.yml", check=False), ev(0.5, "batch_start", play=0, batch=1, batches=2,
                                                                    hosts=["lab3"]),
         *deployed(12, "lab3"), ev(12, "batch_end", play=0, batch=1, failed=[]),
         ev(13, "batch_start", play=0, batch=2, batches=2, hosts=["lab4"]), *deployed(17, "lab4"),
         ev(17, "batch_end", play=0, batch=2, failed=[]), ev(18, "run_end", status="ok")]
    b = [ev(1.5, "run_start", playbook="hotfix", check=False), ev(1.6, "batch_start", play=0, batch=1, batches=1,
                                                                  hosts=["lab4"]),
         ev(5, "task_result", play=0, task=0, name="deploy", host="lab4", status="failed", msg="gate failed"),
         ev(5, "host_done", play=0, host="lab4", status="failed"), ev(5, "run_end", status="failed")]
    runs = [view("20250615-000001-hotfix", b), view("20250615-000000-deploy", a)]  # newest start first
    doc = report.build(fleet(tmp_path, {"lab3": "new-1", "lab4": "new-1"}, {"lab3": ["lab"], "lab4": ["lab"]},
                             runs=runs), now=rs.NOW)
    rows = {r["host"]: r for r in doc["hosts"]}
    assert rows["lab4"]["last_run"]["run_id"] == "20250615-000000-deploy", rows["lab4"]["last_run"]
    assert (rows["lab4"]["last_run"]["result"], rows["lab4"]["level"]) == ("changed", "green")
    assert rows["lab3"]["last_run"]["run_id"] == "20250615-000000-deploy"
