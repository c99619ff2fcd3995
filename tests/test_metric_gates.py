"""Gates on Prometheus: the text format parsed by prometheus_client, series chosen by name and labels,
counter rates and histogram quantiles over a window (PromQL's histogram_quantile), the live canary's
verdict with both numbers, and the spec keys' validation (one line naming file:line and key)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from fleetctl.errors import InputError
from fleetctl.probes import prometheus as prom
from fleetctl.release import live_canary, metric_threshold
from fleetctl.release.health_spec import CanaryBaseline, Threshold
from fleetctl.release.spec import load_spec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fleetctl" / "lab"))
import fake_sglang_api as standin  # noqa: E402  (the stand-in's own /metrics writer)

TEXT = """# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="a",dp="0"} 2.0
sglang:num_queue_reqs{model_name="a",dp="1"} 3.0
sglang:num_queue_reqs{model_name="b",dp="0"} 7.0
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="a"} 100.0
# TYPE h histogram
h_bucket{le="0.1"} 10.0
h_bucket{le="0.2"} 20.0
h_bucket{le="0.4"} 20.0
h_bucket{le="+Inf"} 25.0
h_sum 4.0
h_count 25.0
"""


def served(ttft: list[float], itl: list[float], requests: int | None = None) -> prom.Scrape:
    s = standin.Served()
    for t in ttft:
        s.end(3, 4, 4, t, itl)
    return prom.parse(standin.metrics(argparse.Namespace(model_path="M", spec_algorithm=None), s))


def test_series_are_chosen_by_name_and_labels_and_summed() -> None:
    scrape = prom.parse(TEXT)
    assert prom.total(scrape, "sglang:num_queue_reqs", {}) == 12.0
    assert prom.total(scrape, "sglang:num_queue_reqs", {"model_name": "a"}) == 5.0
    assert prom.total(scrape, "sglang:num_queue_reqs", {"model_name": "a", "dp": "1"}) == 3.0
    with pytest.raises(prom.MetricsError, match=r'no series sglang:num_queue_reqs\{model_name="c"\}'):
        prom.total(scrape, "sglang:num_queue_reqs", {"model_name": "c"})


def test_histogram_quantile_interpolates_in_the_bucket_as_promql_does() -> None:
    cumulative = prom.buckets(prom.parse(TEXT), "h", {})
    assert cumulative == {0.1: 10.0, 0.2: 20.0, 0.4: 20.0, float("inf"): 25.0}
    assert prom.quantile(0.2, cumulative) == pytest.approx(0.05)  # rank 5 of 10 in (0, 0.1]
    assert prom.quantile(0.6, cumulative) == pytest.approx(0.1 + 0.1 * 5 / 10)  # rank 15 in (0.1, 0.2]
    assert prom.quantile(0.99, cumulative) == 0.4  # in +Inf: the highest finite bound
    assert prom.quantile(0.99, {0.1: 0.0, float("inf"): 0.0}) is None  # nothing observed


def test_a_window_is_the_difference_of_two_scrapes() -> None:
    before = prom.Scrape(prom.parse(TEXT).samples, at=10.0)
    later = TEXT
    for old, new in (('{model_name="a"} 100.0', '{model_name="a"} 130.0'), ('le="0.2"} 20.0', 'le="0.2"} 22.0'),
                     ('le="0.4"} 20.0', 'le="0.4"} 24.0'), ('le="+Inf"} 25.0', 'le="+Inf"} 29.0')):
        later = later.replace(old, new)
    after = prom.Scrape(prom.parse(later).samples, at=25.0)
    assert prom.rate(before, after, "sglang:num_requests_total", {}) == pytest.approx(2.0)  # 30 in 15 s
    window = prom.bucket_delta(before, after, "h", {})
    assert window == {0.1: 0.0, 0.2: 2.0, 0.4: 4.0, float("inf"): 4.0}
    assert prom.quantile(0.99, window) == pytest.approx(0.2 + 0.2 * (3.96 - 2) / 2)
    restarted = prom.Scrape(prom.parse(TEXT.replace("100.0", "5.0")).samples, at=30.0)
    assert prom.counter_delta(after, restarted, "sglang:num_requests_total", {}) == 5.0  # a reset counts from 0


def test_the_stand_ins_metrics_parse_with_sglangs_names() -> None:
    scrape = served([0.05, 0.05, 0.7], [0.003, 0.003])
    assert prom.total(scrape, "sglang:num_requests_total", {"model_name": "M"}) == 3.0
    assert prom.total(scrape, "sglang:num_aborted_requests_total", {}) == 0.0
    p99 = prom.quantile(0.99, prom.buckets(scrape, "sglang:time_to_first_token_seconds", {}))
    assert 0.6 < p99 <= 0.8


def test_a_metric_threshold_names_what_it_read_and_judges_the_bounds() -> None:
    t = Threshold(metric="sglang:time_to_first_token_seconds", quantile=0.99, window=30, max=0.5)
    assert metric_threshold.gate_name(t) == "histogram_quantile(0.99, sglang:time_to_first_token_seconds[30s]) <= 0.5"
    before, after = served([], []), served([0.05, 0.7], [])
    ok, detail = metric_threshold.judge(t, metric_threshold.value_of(t, before, after))
    assert not ok and detail.startswith("histogram_quantile(0.99, sglang:time_to_first_token_seconds[30s]) = 0.7")
    queue = Threshold(metric="sglang:num_queue_reqs", labels={"model_name": "a"}, max=5)
    assert metric_threshold.judge(queue, metric_threshold.value_of(queue, None, prom.parse(TEXT))) == \
        (True, 'sglang:num_queue_reqs{model_name="a"} = 5')
    empty = metric_threshold.judge(t, metric_threshold.value_of(t, before, before))
    assert empty == (False, "sglang:time_to_first_token_seconds observed nothing in 30s: nothing to judge")


def pairs(*sides: tuple[list[float], list[float]]) -> list[tuple[prom.Scrape, prom.Scrape]]:
    return [(served([], []), served(ttft, itl)) for ttft, itl in sides]


def test_the_live_canary_fails_when_worse_than_the_baseline_by_more_than_the_ratio_and_says_both() -> None:
    cfg = CanaryBaseline(window=20, checks=[{"measure": "ttft", "max_ratio": 1.5}, {"measure": "error_rate",
                                                                                      "max_ratio": 2}])
    slow = pairs(([1.5] * 10, [0.003]))
    fast = pairs(([0.05] * 10, [0.003]), ([0.05] * 10, [0.003]))
    ok, detail = live_canary.judge(cfg, slow, fast, ["lab2", "lab3"])
    assert not ok
    assert "ttft p99 1.99s on the canary vs 0.099s on lab2, lab3 (20.10x, at most 1.5x)" in detail
    assert "error rate 0 on the canary vs 0 on lab2, lab3" in detail and "[10 vs 20 requests in 20s]" in detail
    ok, detail = live_canary.judge(cfg, fast[:1], fast, ["lab2", "lab3"])
    assert ok, detail
    few = CanaryBaseline(window=20, min_requests=15, checks=[{"measure": "itl", "quantile": 0.5, "max_ratio": 1.2}])
    assert live_canary.judge(few, fast[:1], fast, ["lab2"]) == \
        (False, "too few requests to judge in 20s: 10 on the canary, 20 on lab2 (at least 15 each)")


SPEC = """name: m
version: "1"
base: {adopt: /opt/venv}
health:
  thresholds:
%s
"""


@pytest.mark.parametrize(("threshold", "key", "message"), [
    ("    - {metric: sglang:num_queue_reqs, field: x}", "health.thresholds.0",
     "a threshold reads either field: (a JSON answer) or metric: (/metrics), one of them"),
    ("    - {metric: sglang:num_requests_total, rate: true, max: 3}", "health.thresholds.0",
     "rate needs window: the seconds between the two scrapes"),
    ("    - {field: a.b, window: 5}", "health.thresholds.0", "window is for a metric: threshold, not a field: one"),
    ("    - {metric: 'sglang num'}", "health.thresholds.0.metric", "String should match pattern"),
    ("    - {metric: h, quantile: 1.5}", "health.thresholds.0.quantile", "Input should be less than or equal to 1"),
])
def test_a_bad_metric_key_is_one_line_naming_file_line_and_key(tmp_path: Path, threshold: str, key: str,
                                                               message: str) -> None:
    path = tmp_path / "spec.yml"
    path.write_text(SPEC % threshold)
    with pytest.raises(InputError) as exc:
        load_spec(path)
    text = str(exc.value)
    assert "\n" not in text and f"{path}:6" in text and f"{key}: {message}" in text


def test_a_bad_canary_check_is_named_too(tmp_path: Path) -> None:
    path = tmp_path / "spec.yml"
    path.write_text(SPEC.replace("  thresholds:\n%s\n", "  canary:\n    baseline:\n      checks:\n"
                                 "        - {measure: p99, max_ratio: 1.5}\n"))
    with pytest.raises(InputError, match=r"spec.yml:8.*health.canary.baseline.checks.0.measure: Input should be "):
        load_spec(path)
    path.write_text(SPEC.replace("  thresholds:\n%s\n", "  canary:\n    baseline:\n      checks:\n"
                                 "        - {measure: error_rate, quantile: 0.5, max_ratio: 1.5}\n"))
    with pytest.raises(InputError, match=r"health.canary.baseline.checks.0: quantile is for ttft or itl"):
        load_spec(path)


def test_the_gates_needing_live_traffic_are_the_windowed_thresholds_and_the_canary(tmp_path: Path) -> None:
    from fleetctl.release.service import layout_for

    path = tmp_path / "spec.yml"
    path.write_text(SPEC % ("    - {metric: sglang:num_queue_reqs, max: 4}\n"
                            "    - {metric: sglang:num_requests_total, rate: true, window: 10, min: 1}\n"
                            "  canary:\n    baseline:\n      window: 20\n      labels: {model_name: M}\n"
                            "      checks: [{measure: itl, quantile: 0.5, max_ratio: 1.2}]"))
    spec = load_spec(path)
    [server] = live_canary.live(spec, layout_for({}))
    assert (server.port, [t.metric for t in server.thresholds]) == (30000, ["sglang:num_requests_total"])
    assert [(g.name, g.detail) for g in live_canary.planned(spec, layout_for({}))] == [
        ("threshold: would read", "GET /metrics on port 30000: sglang:num_queue_reqs <= 4"),
        ("threshold: would read", "GET /metrics on port 30000: rate(sglang:num_requests_total[10s]) >= 1 "
                                  "(in rotation, after the other gates)"),
        ("canary: would compare", "GET /metrics on port 30000 and on the run's hosts still on the previous release, "
                                  '20s apart: itl p50 at most 1.2x (sglang:num_requests_total{model_name="M"}, '
                                  'sglang:inter_token_latency_seconds_bucket{model_name="M"})')]
