"""TEST DOUBLE of an SGLang server's HTTP surface. It is NOT SGLang: no model, no GPU, no generation.

The lab has no GPU, so tests, demos and (later) the release flow launch this as the "service" on
lab hosts to exercise health gates and probes. It answers the endpoints fleetctl reads, in the
shapes SGLang uses (see shared/DOMAIN.md):

  GET /health          503 during --start-delay, then --health-status (200 by default), empty body;
                       with --health-hang it never answers (the connection stays open)
  GET /server_info     server args, "version", "internal_states": [{"avg_spec_accept_length": x}]
  GET /model_info      model_path, tokenizer_path, is_generation, ...
  GET /v1/models       OpenAI-style model list
  GET /metrics         Prometheus text
  anything else        404 {"detail": "Not Found"}, as FastAPI does

With --old-api the info endpoints are only under their older names, /get_server_info and
/get_model_info (the new names 404), as in older SGLang releases.

Stdlib only, Python >= 3.8: it runs on the hosts. The command line below is a stable interface
(the release flow launches it); add options, never rename them:

  python3 fake_sglang.py --host H --port N [--version 0.5.23] [--spec-algorithm DDTREE]
      [--accept-length 3.2] [--start-delay S] [--health-status 200|503] [--health-hang] [--old-api]
      [--model-path M] [--tp N] [--verbose] [--release-dir DIR -- LAUNCH ARGS...]

Release mode (``--release-dir``, how ``fleetctl deploy`` runs it on lab hosts, under the release's
own venv python): the launch args after ``--`` are the release's SGLang arguments. The version
is the installed sglang's, and ``--speculative-algorithm`` is checked against the members of
``SpeculativeAlgorithm`` parsed (not imported) from the installed ``spec_info.py``: an algorithm
that release does not have makes the stand-in exit at start, as SGLang's argument parser would.
So the health gates test what was really deployed. For tests, the launch args may also carry
``--standin-health-status 503``, ``--standin-accept-length X``, ``--standin-start-delay S`` and
``--standin-health-hang``.
"""

from __future__ import annotations  # annotations stay strings: Python 3.8 runs this file

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


def server_info(opts: argparse.Namespace) -> dict[str, Any]:
    info = server_args(opts)
    states = {"memory_usage": {"weight": 33.1, "kvcache": 61.2}, "last_gen_throughput": 0.0}
    if opts.spec_algorithm:
        states["avg_spec_accept_length"] = opts.accept_length
    info.update({"version": opts.version, "internal_states": [states], "max_total_num_tokens": 1048576})
    if getattr(opts, "standin", None):
        info["fleetctl_standin"] = opts.standin  # what the release-mode stand-in found installed
    return info


def model_info(opts: argparse.Namespace) -> dict[str, Any]:
    return {"model_path": opts.model_path, "tokenizer_path": opts.model_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForCausalLM"]}


def models(opts: argparse.Namespace, started_at: float) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": opts.model_path, "object": "model", "created": int(started_at),
                                        "owned_by": "sglang", "root": opts.model_path, "max_model_len": 262144}]}


def metrics(opts: argparse.Namespace) -> str:
    label = f'{{model_name="{opts.model_path}"}}'
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{label} 0.0",
        "# HELP sglang:gen_throughput The generation throughput (token/s).",
        "# TYPE sglang:gen_throughput gauge",
        f"sglang:gen_throughput{label} 0.0",
    ]
    if opts.spec_algorithm:
        lines += ["# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.",
                  "# TYPE sglang:spec_accept_length gauge",
                  f"sglang:spec_accept_length{label} {opts.accept_length}"]
    return "\n".join(lines) + "\n"


def routes(opts: argparse.Namespace, started_at: float) -> dict[str, Route]:
    """Path -> function returning (status, content type, body) for one request."""
    def json_route(make: Callable[[], Any]) -> Route:
        return lambda: (200, "application/json", json.dumps(make()))

    table = {
        "/v1/models": json_route(lambda: models(opts, started_at)),
        "/metrics": lambda: (200, PROMETHEUS, metrics(opts)),
    }
    prefix = "/get_" if opts.old_api else "/"
    table[prefix + "server_info"] = json_route(lambda: server_info(opts))
    table[prefix + "model_info"] = json_route(lambda: model_info(opts))
    return table


def make_handler(opts: argparse.Namespace) -> type[BaseHTTPRequestHandler]:
    started_at = time.time()
    table = routes(opts, started_at)

    class Handler(BaseHTTPRequestHandler):
        server_version = "fake-sglang/" + opts.version
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
            path = self.path.split("?", 1)[0]
            if path == "/health" and opts.health_hang:
                time.sleep(3600)  # a server wedged after accepting: the caller's timeout must act
                return
            if path == "/health":
                starting = time.time() - started_at < opts.start_delay
                self.reply(503 if starting else opts.health_status, "text/plain; charset=utf-8", "")
            elif path in table:
                self.reply(*table[path]())
            else:
                self.reply(404, "application/json", json.dumps({"detail": "Not Found"}))

        def reply(self, status: int, content_type: str, body: str) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args: Any) -> None:
            if opts.verbose:
                sys.stderr.write(f"fake_sglang: {fmt % args}\n")

    return Handler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="TEST DOUBLE of an SGLang server's HTTP surface (no model, no GPU).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--version", default="0.5.23", help="reported as the SGLang version")
    p.add_argument("--spec-algorithm", default=None, help="e.g. DFLASH or DDTREE (none by default)")
    p.add_argument("--accept-length", type=float, default=3.2, help="avg_spec_accept_length reported")
    p.add_argument("--start-delay", type=float, default=0.0, help="seconds /health answers 503 after start")
    p.add_argument("--health-status", type=int, choices=(200, 503), default=200, help="/health once started")
    p.add_argument("--health-hang", action="store_true", help="/health accepts the request and never answers")
    p.add_argument("--old-api", action="store_true", help="only /get_server_info and /get_model_info")
    p.add_argument("--model-path", default=DEFAULT_MODEL)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--verbose", action="store_true", help="log requests on stderr")
    p.add_argument("--release-dir", default=None, help="release mode: report the release running from DIR")
    return p.parse_args(argv)


def serve(opts: argparse.Namespace, ready: threading.Event | None = None) -> None:
    """Serve until interrupted; ``ready`` (a threading.Event) is set once the port is bound."""
    httpd = ThreadingHTTPServer((opts.host, opts.port), make_handler(opts))
    httpd.daemon_threads = True
    if ready is not None:
        ready.set()
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()


def installed_release(opts: argparse.Namespace, launch: list[str]) -> argparse.Namespace:
    """Release mode: take version, algorithms and launch args from what is installed and asked."""
    import ast
    import importlib.util
    import os
    from importlib import metadata

    p = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    p.add_argument("--model-path", default=opts.model_path)
    p.add_argument("--tp", "--tp-size", dest="tp", type=int, default=opts.tp)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--standin-health-status", type=int, default=opts.health_status)
    p.add_argument("--standin-accept-length", type=float, default=opts.accept_length)
    p.add_argument("--standin-start-delay", type=float, default=opts.start_delay)
    p.add_argument("--standin-health-hang", action="store_true", default=opts.health_hang)
    args, _unknown = p.parse_known_args(launch)
    spec = importlib.util.find_spec("sglang")
    folder = list(spec.submodule_search_locations or [])[0] if spec else None
    algorithms: list[str] = []
    if folder:
        with open(os.path.join(folder, "srt", "speculative", "spec_info.py"), encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "SpeculativeAlgorithm":
                algorithms = [t.id for item in node.body if isinstance(item, ast.Assign)
                              for t in item.targets if isinstance(t, ast.Name) and t.id.isupper()]
    if args.speculative_algorithm and args.speculative_algorithm.upper() not in algorithms:
        sys.exit(f"error: argument --speculative-algorithm: invalid choice: {args.speculative_algorithm!r} "
                 f"(choose from {', '.join(algorithms)})")
    opts.version = metadata.version("sglang") if folder else "none"
    opts.model_path, opts.tp, opts.spec_algorithm = args.model_path, args.tp, args.speculative_algorithm
    opts.health_status, opts.accept_length = args.standin_health_status, args.standin_accept_length
    opts.start_delay, opts.health_hang = args.standin_start_delay, args.standin_health_hang
    opts.standin = {"release": os.path.basename(os.path.realpath(opts.release_dir)), "spec_algorithms": algorithms,
                    "launch_args": launch, "python": sys.executable}
    return opts


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    launch = argv[argv.index("--") + 1:] if "--" in argv else []
    opts = parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if opts.release_dir:
        opts = installed_release(opts, launch)
    try:
        serve(opts, threading.Event())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
