"""TEST DOUBLE, the answers half of fleetctl/lab/fake_sglang.py: what an SGLang 0.5.23 server says on each
endpoint the gateway and a rollout read (server and model info, generation bodies and SSE chunks, the
Prometheus metrics), in SGLang's own shapes and names. Stdlib only, Python >= 3.8: it runs on the hosts,
beside fake_sglang.py (which imports it)."""

from __future__ import annotations  # annotations stay strings: Python 3.8 runs this file

import argparse
import json
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # collections.abc.Callable[...] is not subscriptable at run time on Python 3.8
    from collections.abc import Callable

    Route = Callable[[], tuple[int, str, str]]


DEFAULT_MODEL = "Qwen/Qwen3.6-35B-A3B"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


def server_args(opts: argparse.Namespace) -> dict[str, Any]:
    """The subset of SGLang's ServerArgs that fleetctl and people look at."""
    spec = opts.spec_algorithm
    return {
        "model_path": opts.model_path,
        "tokenizer_path": opts.model_path,
        "host": opts.host,
        "port": opts.port,
        "tp_size": opts.tp,
        "dtype": "auto",
        "mem_fraction_static": 0.85,
        "mamba_scheduler_strategy": "extra_buffer",
        "speculative_algorithm": spec,
        "speculative_draft_model_path": (opts.model_path + "-DFlash") if spec else None,
        "speculative_num_draft_tokens": 16 if spec else None,
        "speculative_ddtree_budget": 64 if spec == "DDTREE" else None,
        "enable_metrics": True,
    }


# Histogram buckets: SGLang's defaults (sglang 0.5.23 srt/observability/metrics_collector.py,
# TokenizerMetricsCollector: bucket_time_to_first_token, bucket_inter_token_latency).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
               0.4, 0.6, 0.8, 1.0, 2.0, 4.0)


class Served:
    """What the server serves and has served: in flight (SGLang's num_running_reqs), tokens, latency
    histograms, and whether it drains. SGLang reports an acceptance length only after a generation."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.tokens = 0
        self.verify_steps = 0
        self.running = 0
        self.draining = False
        self.prompt_tokens = 0
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.nodes: Nodes | None = None  # a multi-node server's ranks (--nnodes > 1)

    def join_group(self, nnodes: int, rank: int, addr: str) -> None:
        self.nodes = Nodes(nnodes, rank, addr)
        self.nodes.start()

    def group_ready(self) -> bool:
        return self.nodes is None or self.nodes.ready()

    def lost_peers(self) -> int:
        return 0 if self.nodes is None else self.nodes.lost

    def abort(self) -> None:
        with self.lock:
            self.running -= 1

    def begin(self) -> bool:
        """Admit one generation, draining or not: SGLang's generate_request has no shutdown check
        (srt/managers/tokenizer_manager.py); only /health and /ready say 503 while it drains."""
        with self.lock:
            self.running += 1
            return True

    def end(self, prompt: int, tokens: int, steps: int, ttft: float, itl: list[float]) -> None:
        with self.lock:
            self.running -= 1
            self.requests += 1
            self.tokens += tokens
            self.prompt_tokens += prompt
            self.verify_steps += steps
            self.ttft.append(ttft)
            self.itl.extend(itl)

    def accept_length(self) -> float | None:
        with self.lock:
            return self.tokens / self.verify_steps if self.verify_steps else None


class PeerLost(ConnectionAbortedError):
    """A rank of this multi-node server went away while the request ran."""


class Nodes:
    """A multi-node server's ranks, as far as serving can tell: torch.distributed's store at
    ``--dist-init-addr`` (rank 0 listens there, every other rank connects to it; sglang 0.5.23
    srt/distributed/parallel_state.py init_distributed_environment, ``tcp://`` + dist_init_addr). SGLang
    serves only with every rank up: rank 0's /health is 503 until all ``--nnodes`` ranks joined, and a
    rank lost while requests run breaks them (the collective fails; SGLang's scheduler dies with it).
    Here rank 0 stays up, cuts its requests in flight and answers 503 until the rank is back."""

    def __init__(self, nnodes: int, rank: int, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        self.nnodes, self.rank, self.where = nnodes, rank, (host, int(port))
        self.joined, self.lost = 0, 0
        self.lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._listen if self.rank == 0 else self._join, daemon=True).start()

    def ready(self) -> bool:
        return self.joined >= (self.nnodes - 1 if self.rank == 0 else 1)

    def _listen(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(self.where)
        sock.listen(64)
        while True:
            conn, _ = sock.accept()
            threading.Thread(target=self._peer, args=(conn,), daemon=True).start()

    def _peer(self, conn: socket.socket) -> None:
        with self.lock:
            self.joined += 1
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        finally:
            with self.lock:
                self.joined, self.lost = self.joined - 1, self.lost + 1

    def _join(self) -> None:
        while True:
            try:
                with socket.create_connection(self.where, timeout=1) as conn:
                    conn.settimeout(None)
                    self.joined = 1
                    while conn.recv(64):
                        pass
            except OSError:
                pass
            self.joined = 0
            time.sleep(0.1)


def server_info(opts: argparse.Namespace, served: Served) -> dict[str, Any]:
    info = server_args(opts)
    states: dict[str, Any] = {"memory_usage": {"weight": 33.1, "kvcache": 61.2}, "last_gen_throughput": 0.0}
    accept = served.accept_length()
    if opts.spec_algorithm and accept is not None:
        states["avg_spec_accept_length"] = round(accept, 4)
    info.update({"version": opts.version, "internal_states": [states], "max_total_num_tokens": 1048576})
    if getattr(opts, "standin", None):
        info["fleetctl_standin"] = opts.standin  # what the release-mode stand-in found installed
        # The GPUs it was given (a real server sees only these): shows which instance got which.
        info["fleetctl_standin"]["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return info


def asked(body: dict[str, Any], kind: str) -> tuple[int, str]:
    """(tokens to generate, prompt) of a request to /generate (``native``), /v1/completions or chat."""
    if kind == "native":
        tokens, prompt = (body.get("sampling_params") or {}).get("max_new_tokens"), body.get("text")
    else:
        tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        prompt = body.get("prompt") if kind == "completions" else " ".join(
            str(m.get("content") or "") for m in body.get("messages") or [] if isinstance(m, dict))
    return max(1, min(int(tokens or 16), 4096)), str(prompt or "")


def generate(opts: argparse.Namespace, served: Served, body: dict[str, Any], kind: str,
             emit: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """One generation, one token every 1 / --decode-tps seconds; ``emit(i, meta)`` after each token
    (streaming). Answers the final body, shaped as SGLang answers ``kind``."""
    tokens, prompt = asked(body, kind)
    start = last = time.monotonic()
    peers_lost = served.lost_peers()
    ttft, itl = 0.0, []
    time.sleep(getattr(opts, "prefill_delay", 0.0))  # the time to first token beyond one decode step
    for i in range(1, tokens + 1):
        time.sleep(1.0 / opts.decode_tps)
        now = time.monotonic()
        if i == 1:
            ttft = now - start
        else:
            itl.append(now - last)
        last = now
        if i == tokens - 1 and opts.hold_file and prompt == "hold":
            while not os.path.exists(opts.hold_file):  # a test holds this stream in flight
                time.sleep(0.05)
        if served.lost_peers() != peers_lost:  # a rank went away: this request is lost with it
            served.abort()
            raise PeerLost(f"a rank of this {opts.nnodes}-node server was lost")
        if emit is not None:
            emit(i, {"completion_tokens": i})
    meta: dict[str, Any] = {"id": f"standin-{served.requests}", "finish_reason": {"type": "length", "length": tokens},
                            "prompt_tokens": max(1, len(prompt.split())), "completion_tokens": tokens,
                            "cached_tokens": 0, "e2e_latency": round(last - start, 4)}
    steps = tokens
    if opts.spec_algorithm:
        steps = max(1, round(tokens / opts.accept_length))
        meta.update(spec_verify_ct=steps, spec_accept_length=round(tokens / steps, 4))
    served.end(meta["prompt_tokens"], tokens, steps, ttft, itl)
    return final_body(opts, kind, " ".join(["token"] * tokens), meta)


def final_body(opts: argparse.Namespace, kind: str, text: str, meta: dict[str, Any]) -> dict[str, Any]:
    if kind == "native":
        return {"text": text, "meta_info": meta}
    tokens = meta["completion_tokens"]
    usage = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": tokens,
             "total_tokens": meta["prompt_tokens"] + tokens}
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": meta["id"], "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": opts.model_path, "choices": [choice], "usage": usage,
            "meta_info": meta}


def stream_chunk(opts: argparse.Namespace, kind: str, rid: str, i: int, final: dict[str, Any] | None) -> dict[str, Any]:
    """One SSE event's JSON: native /generate sends the text so far with its meta_info (sglang 0.5.23
    srt/entrypoints/http_server.py serve_generate_request: ``b"data: " + dumps_json(out) + b"\n\n"``);
    the OpenAI routes send one token's delta per chunk, the last with finish_reason "length"
    (srt/entrypoints/openai/protocol.py CompletionStreamResponse, ChatCompletionStreamResponse)."""
    if kind == "native":
        return {"text": " ".join(["token"] * i), "meta_info": final["meta_info"] if final else
                {"id": rid, "finish_reason": None, "completion_tokens": i}, "index": 0}
    piece = ("" if i == 1 else " ") + "token" if final is None else ""
    reason = "length" if final is not None else None
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
    if kind == "chat":
        choice["delta"] = {"role": "assistant", "content": piece} if i == 1 and final is None else {"content": piece}
    else:
        choice["text"] = piece
    chunk = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
             "created": int(time.time()), "model": opts.model_path, "choices": [choice]}
    return chunk


def model_info(opts: argparse.Namespace) -> dict[str, Any]:
    return {"model_path": opts.model_path, "tokenizer_path": opts.model_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForCausalLM"]}


def models(opts: argparse.Namespace, started_at: float) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": opts.model_path, "object": "model", "created": int(started_at),
                                        "owned_by": "sglang", "root": opts.model_path, "max_model_len": 262144}]}


def metrics(opts: argparse.Namespace, served: Served) -> str:
    """SGLang's Prometheus names and labels (sglang 0.5.23 srt/observability/metrics_collector.py:
    SchedulerMetricsCollector's gauges, TokenizerMetricsCollector's counters and histograms)."""
    label = f'model_name="{opts.model_path}"'
    with served.lock:
        running, requests, prompt, tokens = served.running, served.requests, served.prompt_tokens, served.tokens
        ttft, itl = list(served.ttft), list(served.itl)
    lines: list[str] = []

    def family(name: str, kind: str, doc: str, samples: list[str]) -> None:
        lines.extend([f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *samples])

    family("sglang:num_running_reqs", "gauge", "The number of running requests.",
           [f"sglang:num_running_reqs{{{label}}} {float(running)}"])
    family("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
           [f"sglang:num_queue_reqs{{{label}}} 0.0"])
    family("sglang:gen_throughput", "gauge", "The generation throughput (token/s).",
           [f"sglang:gen_throughput{{{label}}} 0.0"])
    for name, doc, value in (("prompt_tokens", "Number of prefill tokens processed.", prompt),
                             ("generation_tokens", "Number of generation tokens processed.", tokens),
                             ("num_requests", "Number of requests processed.", requests),
                             ("num_aborted_requests", "Number of requests aborted.", 0)):  # it never aborts
        family(f"sglang:{name}_total", "counter", doc, [f"sglang:{name}_total{{{label}}} {float(value)}"])
    lines += histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                       label, TTFT_BUCKETS, ttft)
    lines += histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                       label, ITL_BUCKETS, itl)
    accept = served.accept_length()
    if opts.spec_algorithm and accept is not None:
        family("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
               [f"sglang:spec_accept_length{{{label}}} {accept:.4f}"])
    return "\n".join(lines) + "\n"


def histogram(name: str, doc: str, label: str, buckets: tuple[float, ...], seen: list[float]) -> list[str]:
    """Prometheus text of a histogram, cumulative buckets as prometheus_client writes them."""
    out = [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    for le in buckets:
        out.append(f'{name}_bucket{{{label},le="{float(le)}"}} {float(sum(1 for x in seen if x <= le))}')
    out += [f'{name}_bucket{{{label},le="+Inf"}} {float(len(seen))}', f"{name}_sum{{{label}}} {sum(seen)}",
            f"{name}_count{{{label}}} {float(len(seen))}"]
    return out


def routes(opts: argparse.Namespace, started_at: float, served: Served) -> dict[str, Route]:
    """Path -> function returning (status, content type, body) for one GET."""
    def json_route(make: Callable[[], Any]) -> Route:
        return lambda: (200, "application/json", json.dumps(make()))

    table = {"/v1/models": json_route(lambda: models(opts, started_at))}
    if opts.enable_metrics:  # SGLang serves /metrics only when started with --enable-metrics
        table["/metrics"] = lambda: (200, PROMETHEUS, metrics(opts, served))
    prefix = "/get_" if opts.old_api else "/"
    table[prefix + "server_info"] = json_route(lambda: server_info(opts, served))
    table[prefix + "model_info"] = json_route(lambda: model_info(opts))
    return table
