"""``fleetctl report`` without hosts: the document built from a synthetic fleet (report_support), the
page rendered from it (self-contained, hostile strings escaped, a text verdict beside every colour),
the drift view sharing its renderer and stylesheet, and the run journals read back."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import report_support as rs

from fleetctl.drift import report as drift_report
from fleetctl.pages import render as report_html
from fleetctl.report import fleet as report
from fleetctl.report.runs import last_runs, last_touch, view


class Page(HTMLParser):
    """Every tag's attributes, the host table's rows (cells' text) and the text of the whole page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.rows: dict[str, list[str]] = {}
        self.text: list[str] = []
        self._row: str | None = None
        self._in_td = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "tr" and (a.get("id") or "").startswith("host-"):
            self._row = str(a["data-host"])
            self.rows[self._row] = []
        elif tag == "td" and self._row is not None:
            self.rows[self._row].append("")
            self._in_td = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        self._in_td = self._in_td and tag != "td"

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._row is not None and self._in_td:
            self.rows[self._row][-1] += data


def page(html: str) -> Page:
    p = Page()
    p.feed(html)
    return p


def test_host_rows_judge_each_part_and_sort_worst_first(tmp_path: Path) -> None:
    doc = report.build(rs.fleet(tmp_path), now=rs.NOW)
    rows = {r["host"]: r for r in doc["hosts"]}
    assert [r["host"] for r in doc["hosts"]] == ["down", "redgpu", "stale", "stopped", "good1"]
    assert doc["summary"] == {"hosts": 5, "red": 4, "amber": 0, "green": 1, "line": "5 hosts: 4 red, 0 amber, 1 green"}
    good = rows["good1"]
    assert (good["level"], good["problems"], good["groups"]) == ("green", [], ["gpu", "canary"])
    assert (good["release"]["current"], good["release"]["previous"]) == ("plain-1", "old-0")
    assert [(i["name"], i["service"], i["health"], i["level"]) for i in good["instances"]] == [
        ("sglang", "running", "200", "green")]
    assert good["gpu"] == {"level": "green", "text": "1 GPU, every check green", "rule": None, "value": None,
                           "models": ["1x NVIDIA H200"]}
    assert (good["last_run"]["result"], good["last_run"]["level"]) == ("changed", "green")
    red = rows["redgpu"]
    assert (red["gpu"]["level"], red["gpu"]["rule"]) == ("red", "row_remapping")
    assert red["gpu"]["text"].startswith("GPU 0 row_remapping: pending: yes")
    assert (red["last_run"]["result"], red["last_run"]["level"]) == ("rolled back", "amber")
    stale = rows["stale"]
    assert stale["drift"] == {"level": "red", "counts": {"version": 1, "extra": 1}, "text": "1 version, 1 extra"}
    assert stale["problems"] == ["drift: 1 version, 1 extra"]
    assert rows["stopped"]["problems"] == ["instance sglang: stopped, health -"]
    assert rows["down"]["status"] == "unreachable" and rows["down"]["problems"][0].startswith("unreachable: ssh")
    assert report.exit_code(doc) == 2
    json.dumps(doc)  # --json prints exactly this document


def test_drift_classes_matrix_rollouts_timelines(tmp_path: Path) -> None:
    g = rs.fleet(tmp_path)
    doc = report.build(g, now=rs.NOW)
    assert [(c["kind"], c["level"], c["hosts"]) for c in doc["drift"]["classes"]] == [
        ("version", "red", ["stale"]), ("extra", "amber", ["stale"])]
    assert [r["name"] for r in doc["drift"]["matrix"]["rows"]] == ["evil-pkg", "sglang"]  # only rows that differ
    g_all = rs.fleet(tmp_path)
    g_all = type(g_all)(type(g_all.request)(**{**g_all.request.__dict__, "show_all": True}), g_all.hosts,
                        g_all.drift, g_all.runs)
    assert len(report.build(g_all, now=rs.NOW)["drift"]["matrix"]["rows"]) == 6  # python stack row + 5 packages
    [run] = doc["rollouts"]
    assert (run["status"], [b["hosts"] for b in run["batches"]], [b["failed"] for b in run["batches"]]) == (
        "failed", [["good1"], ["redgpu"]], [[], ["redgpu"]])
    assert [round(b["seconds"], 1) for b in run["batches"]] == [8.5, 20.5]
    assert [(r["host"], r["status"], r["to"]) for r in run["rollbacks"]] == [("redgpu", "rolled-back", "plain-1")]
    assert run["canary"] == [{"host": "good1", "gate": "health", "ok": True, "detail": "200 after 2.1 s",
                              "seconds": 2.1}]
    tl = {t["host"]: t for t in doc["timelines"]}
    assert [s["to"] for s in tl["redgpu"]["switches"]] == ["old-0", "plain-1", "ddtree-2", "plain-1"]
    assert [s["rollback"] for s in tl["redgpu"]["switches"]] == [False, False, False, True]
    segs = tl["good1"]["segments"]
    assert [(s["release"], s["left"]) for s in segs] == [("old-0", 0.0), ("plain-1", round(300 / 7, 2))]
    assert segs[0]["colour"] != segs[1]["colour"]  # two releases, two colours (and each id written)


def test_page_is_self_contained_escaped_and_readable_without_colour(tmp_path: Path) -> None:
    doc = report.build(rs.fleet(tmp_path), now=rs.NOW)
    html = report.to_html(doc)
    p = page(html)
    assert rs.EVIL not in html and "&lt;script&gt;alert(" in html  # hostile strings show, escaped
    scripts = [a for t, a in p.tags if t == "script"]
    assert scripts == [{}]  # one inline script (sort and filter), nothing loaded
    assert not [t for t, a in p.tags if t in ("link", "img", "iframe", "object", "embed")]
    refs = [v for _, a in p.tags for k, v in a.items() if k in ("src", "href", "action")]
    assert refs and all(v and v.startswith("#") for v in refs)  # links stay inside the page
    assert not re.search(r"url\(|@import", html)
    assert set(p.rows) == {"down", "redgpu", "stale", "stopped", "good1"}
    assert p.rows["redgpu"][1].startswith("RED") and "row_remapping" in p.rows["redgpu"][1]
    assert p.rows["good1"][1] == "OKall checks OK"
    assert p.rows["stale"][4] == "RED1\xa0version, 1\xa0extra"
    assert "rolled back" in p.rows["redgpu"][6]
    # every coloured verdict cell carries its word: RED / AMBER / OK
    for tag, a in p.tags:
        if tag == "td" and a.get("class") in ("red", "amber", "green") and a.get("data-label"):
            assert a.get("data-sort") is not None
    assert all(cells[1].startswith(("RED", "AMBER", "OK")) for cells in p.rows.values())
    assert "@media print" in html and "@media (max-width: 760px)" in html


def test_drift_html_is_a_view_of_the_same_renderer(tmp_path: Path) -> None:
    g = rs.fleet(tmp_path)
    drift_page = drift_report.to_html(g.drift)
    css = (report_html.TEMPLATES / "report.css").read_text()
    assert css in drift_page and css in report.to_html(report.build(g, now=rs.NOW))
    p = page(drift_page)
    assert not [t for t, _ in p.tags if t == "script"]
    assert ("table", {"id": "matrix"}) in p.tags and ("section", {"class": "kind red", "id": "drift-version"}) in p.tags


def test_journals_read_back(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    events = rs.journal("x", "b", "a")
    (runs / "20250101-000000-old.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    # a controller killed in batch 2, a day later
    cut = [{**e, "ts": e["ts"] + 86400} for e in events if e["event"] not in ("run_end",)][:6]
    (runs / "20250102-000000-killed.jsonl").write_text("".join(json.dumps(e) + "\n" for e in cut) + '{"ts": 1, "ev')
    found = last_runs(runs, 5)
    assert [r.run_id for r in found] == ["20250102-000000-killed", "20250101-000000-old"]
    assert (found[0].status, found[0].hosts) == ("incomplete", {"a": "changed", "b": "incomplete"})
    assert last_touch(found)["b"]["result"] == "incomplete" and last_touch(found)["a"]["run_id"] == found[0].run_id
    assert [r.run_id for r in last_runs(runs, 5, hosts=["nobody"])] == []
    assert view("x", events).hosts == {"a": "changed", "b": "rolled back"}


def test_the_gateway_beside_each_host_and_as_a_section(tmp_path: Path) -> None:
    """good1's worker serves in its gateway (green); good2's is out of one gateway and the other did
    not answer (amber, saying which and why); the page has a Gateways section with every worker."""
    from fleetctl.gateway.status import GatewayStatus, WorkerRow

    g = rs.fleet(tmp_path, n_green=2)
    one, two = "http://gw1:30080", "http://gw2:30080"
    for name, gateways in (("good1", [one]), ("good2", [one, two])):
        g.hosts[name].value.workers = [{"url": f"http://{name}:30000", "gateways": gateways}]  # type: ignore[union-attr]
    out = "not registered: left out by a change that failed, or never added (server running plain-1, /health 200)"
    g.gateways = [GatewayStatus(one, workers=[WorkerRow(one, "http://good1:30000", "good1", "id-1", "ready", True, 3),
                                              WorkerRow(one, "http://good2:30000", "good2", why=out)]),
                  GatewayStatus(two, error=f"gateway {two} unreachable: refused")]
    doc = report.build(g, now=rs.NOW)
    rows = {r["host"]: r for r in doc["hosts"]}
    assert (rows["good1"]["gateway"]["level"], rows["good1"]["gateway"]["text"]) == (
        "green", f"1 worker serving in {one}")
    assert rows["good2"]["gateway"]["level"] == "amber"
    assert rows["good2"]["problems"] == [
        f"gateway: http://good2:30000 out in {one}: {out}; gateway {two} did not answer"]
    assert rows["stale"]["gateway"]["level"] == "none"
    assert f"gateway {two} did not answer: gateway {two} unreachable: refused" in doc["notes"]
    assert [w["url"] for w in doc["gateways"][0]["workers"]] == ["http://good1:30000", "http://good2:30000"]
    p = page(report.to_html(doc))
    assert p.rows["good2"][-1].startswith("AMBER") and "out in http://gw1:30080" in p.rows["good2"][-1]
    assert p.rows["good1"][-1] == f"OK1 worker serving in {one}"
    text = "".join(p.text)
    assert "Gateways" in text and out in text and f"did not answer: gateway {two} unreachable" in text
