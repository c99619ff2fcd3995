"""The stand-in server against SGLang 0.5.23's own source (the wheel in the Makefile's cache): the
metric names it exports, the SSE framing of its streams, /health's 503 while starting and while
draining, and SIGTERM's drain (the stream in flight completes, then the process exits 0)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import urllib.error
import urllib.request
import zipfile
from functools import cache
from pathlib import Path

from gateway_support import processes, sse_events, start_stand_in, stream_once

WHEELS = Path(os.environ.get("FLEETCTL_FULL_WHEELS", "/var/cache/fleetctl-wheels/sglang-0.5.23"))
SGLANG_WHEEL = "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"


@cache
def sglang_source(path: str) -> str:
    """A file of the sglang 0.5.23 wheel, read from the wheel itself."""
    wheel = WHEELS / SGLANG_WHEEL
    assert wheel.exists(), f"{wheel} is missing: make wheels fills the cache"
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(f"sglang/{path}").decode()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def post(url: str, doc: dict[str, object]) -> tuple[int, bytes, str]:
    request = urllib.request.Request(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read(), answer.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), ""


def test_metric_names_and_types_are_sglangs() -> None:
    source = sglang_source("srt/observability/metrics_collector.py")
    with processes() as procs:
        url, _ = start_stand_in(procs, "--enable-metrics", "--decode-tps", "2000")
        assert post(url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 5}})[0] == 200
        status, text = get(url + "/metrics")
    assert status == 200
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:prompt_tokens_total",
                 "sglang:generation_tokens_total", "sglang:num_requests_total",
                 "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"):
        assert name in types, name
        kind = {"gauge": "Gauge", "counter": "Counter", "histogram": "Histogram"}[types[name]]
        assert re.search(rf'{kind}\(\s*name="{re.escape(name)}"', source), f"{name} is not a {kind} in SGLang"
    assert 'sglang:generation_tokens_total{model_name="Qwen/Qwen3.6-35B-A3B"} 5.0' in text
    assert 'sglang:time_to_first_token_seconds_count{model_name="Qwen/Qwen3.6-35B-A3B"} 1.0' in text


def test_metrics_only_with_enable_metrics() -> None:
    with processes() as procs:
        url, _ = start_stand_in(procs)
        assert get(url + "/metrics")[0] == 404


def test_sse_framing_is_sglangs() -> None:
    http_server = sglang_source("srt/entrypoints/http_server.py")
    chat = sglang_source("srt/entrypoints/openai/serving_chat.py")
    assert 'yield b"data: " + dumps_json(out) + b"\\n\\n"' in http_server
    assert 'yield b"data: [DONE]\\n\\n"' in http_server and 'media_type="text/event-stream"' in http_server
    assert 'yield "data: [DONE]\\n\\n"' in chat and 'object: str = "chat.completion.chunk"' in \
        sglang_source("srt/entrypoints/openai/protocol.py")
    with processes() as procs:
        url, _ = start_stand_in(procs, "--decode-tps", "2000")
        native = post(url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}, "stream": True})
        chat_answer = post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                          "max_tokens": 3, "stream": True})
        plain = post(url + "/v1/completions", {"prompt": "hi", "max_tokens": 3})
    status, body, ctype = native
    assert (status, ctype.split(";")[0]) == (200, "text/event-stream")
    assert body.endswith(b"data: [DONE]\n\n") and body.startswith(b"data: {")
    events = sse_events(body)
    assert [json.loads(e)["meta_info"]["completion_tokens"] for e in events[:-1]] == [1, 2, 3, 4, 4]
    assert json.loads(events[-2])["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    chunks = [json.loads(e) for e in sse_events(chat_answer[1])[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "token token token"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert json.loads(plain[1])["usage"]["completion_tokens"] == 3


def test_health_is_503_while_loading_and_while_draining() -> None:
    http_server = sglang_source("srt/entrypoints/http_server.py")
    assert "if _global_state.tokenizer_manager.gracefully_exit:" in http_server
    assert "ServerStatus.Starting:\n        return Response(status_code=503)" in http_server
    with processes() as procs:
        url, _ = start_stand_in(procs, "--start-delay", "3600")
        assert get(url + "/health")[0] == 503
        assert post(url + "/generate", {"text": "hi"})[0] == 503


def test_sigterm_drains_the_stream_in_flight_then_exits() -> None:
    """A stream in flight when SIGTERM comes completes in full; meanwhile /health and /ready are 503 and a
    new generation is still admitted (SGLang's generate_request has no shutdown check: is_ready() only
    answers /ready); then the server exits 0 (SGLang's sigterm_watchdog)."""
    manager = sglang_source("srt/managers/tokenizer_manager.py")
    assert "async def sigterm_watchdog(self):" in manager
    assert "return not self.is_pause and self.is_healthy()" in manager
    assert "status_code = 200 if _global_state.tokenizer_manager.is_ready() else 503" in \
        sglang_source("srt/entrypoints/http_server.py")
    with processes() as procs:
        url, proc = start_stand_in(procs, "--enable-metrics", "--decode-tps", "40")
        result: list[tuple[int, str]] = []
        streaming = threading.Thread(target=lambda: result.append(stream_once(url, 200)))
        streaming.start()
        while "sglang:num_running_reqs{model_name=\"Qwen/Qwen3.6-35B-A3B\"} 1.0" not in get(url + "/metrics")[1]:
            assert streaming.is_alive()
        proc.send_signal(signal.SIGTERM)
        while get(url + "/health")[0] != 503:
            assert proc.poll() is None
        assert get(url + "/ready")[0] == 503
        assert post(url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})[0] == 200
        streaming.join(timeout=60)
        assert result == [(200, "")]
        assert proc.wait(timeout=30) == 0



def test_a_rank_above_0_serves_only_sglangs_health_server() -> None:
    """SGLang's node of rank > 0 runs no API server, only launch_dummy_health_check_server: /ping,
    /health, /health_generate (and /metrics with --enable-metrics); the stand-in, the same."""
    engine = sglang_source("srt/entrypoints/engine.py")
    assert "if get_parallel().node_rank >= 1:" in engine and "launch_dummy_health_check_server(" in engine
    common = sglang_source("srt/utils/common.py")
    dummy = common.split("def launch_dummy_health_check_server(", 1)[1].split("\ndef ", 1)[0]
    routes = sorted(line.split('"')[1] for line in dummy.splitlines() if "@app.get(" in line)
    assert routes == ["/health", "/health_generate", "/ping"]
    assert "if enable_metrics:" in dummy and "add_prometheus_middleware(app)" in dummy
    with processes() as procs:
        url, _ = start_stand_in(procs, "--node-rank", "1", "--enable-metrics")
        assert {path: get(url + path)[0] for path in [*routes, "/metrics"]} == {
            "/health": 200, "/health_generate": 200, "/ping": 200, "/metrics": 200}
        assert {path: get(url + path)[0] for path in ("/server_info", "/model_info", "/v1/models")} == {
            "/server_info": 404, "/model_info": 404, "/v1/models": 404}
        assert post(url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})[0] == 404
