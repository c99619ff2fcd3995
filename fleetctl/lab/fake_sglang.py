"""TEST DOUBLE of an SGLang server's HTTP surface. It is NOT SGLang: no model, no GPU, no generation.

The lab has no GPU, so tests, demos and (later) the release flow launch this as the "service" on
lab hosts to exercise health gates and probes. It answers the endpoints fleetctl reads, in the
shapes SGLang uses (see shared/DOMAIN.md):

  GET /health, /ready  503 during --start-delay (the model loading) and while draining, then
                       --health-status (200 by default), empty body; with --health-hang it never answers
  --hang PATH          (repeatable) a GET or POST of PATH is accepted and never answered: the server logs
                       ``fake_sglang: hung PATH: arrived at T, closed by the client after S s`` (T on
                       time.monotonic(), the machine's clock) once the caller gives up
  GET /server_info     server args, "version", "internal_states": [{...}]; with speculative decoding
                       "avg_spec_accept_length" appears only once a generation has been served, as
                       SGLang's scheduler reports it only after a speculative decode step
  GET /model_info      model_path, tokenizer_path, is_generation, ...
  GET /v1/models       OpenAI-style model list
  GET /metrics         Prometheus text, only with --enable-metrics (404 otherwise, as SGLang): SGLang's
                       names (in-flight gauges, token counters, TTFT/ITL histograms)
  POST /generate       {"text", "sampling_params": {"max_new_tokens"}, "stream"} -> {"text", "meta_info": {
                       "completion_tokens", "e2e_latency", "spec_verify_ct", "spec_accept_length"}},
                       one token every 1 / --decode-tps seconds (SGLang's own meta_info names); with
                       "stream": true, SSE: one ``data: {...}`` event per token, then ``data: [DONE]``
  POST /v1/completions, /v1/chat/completions  OpenAI-style, "usage"; SSE chunks with "stream": true
  anything else        404 {"detail": "Not Found"}, as FastAPI does

SIGTERM drains as SGLang does: /health and /ready answer 503, the requests in flight finish, then it
exits 0; new generations are still admitted meanwhile, as SGLang admits them (a gateway must take the
worker out first, or a loaded worker's drain runs into its stop timeout).

A node of rank > 0 of a multi-node server (``--node-rank N``, N >= 1) serves what SGLang's rank > 0
serves: no tokenizer, no API server, only its dummy health server (sglang 0.5.23
srt/entrypoints/engine.py: ``if get_parallel().node_rank >= 1`` ... ``launch_dummy_health_check_server``;
srt/utils/common.py: GET /ping, /health, /health_generate answer 200, plus /metrics with
--enable-metrics); every other path is 404 there. With ``--nnodes N --dist-init-addr H:P`` the ranks
join at H:P (rank 0 listens): rank 0 is 503 until all joined; a rank lost cuts rank 0's streams in flight.

With --old-api the info endpoints are only under their older names, /get_server_info and
/get_model_info (the new names 404), as in older SGLang releases.

Stdlib only, Python >= 3.8: it runs on the hosts. The command line below is a stable interface
(the release flow launches it); add options, never rename them:

  python3 fake_sglang.py --host H --port N [--version 0.5.23] [--spec-algorithm DDTREE]
      [--accept-length 3.2] [--decode-tps 400] [--start-delay S] [--health-status 200|503]
      [--health-hang] [--hang PATH]... [--old-api] [--enable-metrics] [--model-path M] [--tp N] [--verbose]
      [--release-dir DIR -- LAUNCH ARGS...]

Release mode (``--release-dir``, how ``fleetctl deploy`` runs it on lab hosts, under the release's
own venv python): the launch args after ``--`` are the release's SGLang arguments. Where the
release's venv can import SGLang's own parser (``ServerArgs.add_cli_args``, a full environment),
the args are parsed by it, so an unknown flag stops the stand-in exactly as it stops SGLang
(``sglang serve: error: unrecognized arguments: ...``). Otherwise (a ``--no-deps`` venv)
``--speculative-algorithm`` is checked against the members of ``SpeculativeAlgorithm`` parsed (not
imported) from the installed ``spec_info.py``, and /server_info says which check ran. The version
is the installed sglang's. For tests, the launch args may also carry ``--standin-health-status
503``, ``--standin-accept-length X``, ``--standin-decode-tps N``, ``--standin-start-delay S``,
``--standin-bind-delay S`` (listen only after S seconds, as SGLang binds after loading),
``--standin-health-hang``, ``--standin-hang PATH`` (as ``--hang``) and ``--standin-hold-file F`` (a
stream of the prompt "hold" sends its last token only once F exists: a test holds a request in flight).
"""

from __future__ import annotations  # annotations stay strings: Python 3.8 runs this file

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # collections.abc.Callable[...] is not subscriptable at run time on Python 3.8
    from collections.abc import Callable

    Route = Callable[[], tuple[int, str, str]]

# SGLang's answers live in fake_sglang_api.py, shipped beside this file (on a host the release holds both).
try:
    from fleetctl.lab.fake_sglang_api import DEFAULT_MODEL, Served, asked, generate, routes, stream_chunk
except ImportError:  # run as a script (a lab host's release, a test's copy): the sibling file
    from fake_sglang_api import (  # type: ignore[import-not-found,no-redef]
        DEFAULT_MODEL,
        Served,
        asked,
        generate,
        routes,
        stream_chunk,
    )

# What a rank > 0 node serves (sglang 0.5.23 srt/utils/common.py launch_dummy_health_check_server).
RANK_N_PATHS = ("/ping", "/health", "/health_generate", "/metrics")
GENERATION = {"/generate": "native", "/v1/completions": "completions", "/v1/chat/completions": "chat"}


class StandinHandler(BaseHTTPRequestHandler):
    """One connection's requests; ``make_handler`` gives each server its options and state."""

    protocol_version = "HTTP/1.1"
    opts: argparse.Namespace
    served: Served
    started_at: float
    table: dict[str, Route]

    def do_GET(self) -> None:  # noqa: N802 - the name http.server dispatches to
        path = self.path.split("?", 1)[0]
        if self.opts.node_rank >= 1 and path not in RANK_N_PATHS:  # rank > 0: SGLang's dummy health server
            self.reply(404, "application/json", json.dumps({"detail": "Not Found"}))
            return
        if path in ("/ping", "/health_generate") and self.opts.node_rank >= 1:
            path = "/health"
        if path == "/health" and self.opts.health_hang:
            time.sleep(3600)  # a server wedged after accepting: the caller's timeout must act
            return
        if path in self.opts.hang:
            self.hang(path)
            return
        # 503 while starting and while draining (http_server.py: health_generate; /ready: is_ready())
        if path in ("/health", "/ready"):
            starting = time.time() - self.started_at < self.opts.start_delay
            down = starting or self.served.draining or not self.served.group_ready()
            status = 503 if down else self.opts.health_status
            self.reply(status, "text/plain; charset=utf-8", "")
        elif path in self.table:
            self.reply(*self.table[path]())
        else:
            self.reply(404, "application/json", json.dumps({"detail": "Not Found"}))

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(min(length, 1 << 20)) if length else b"{}"
        if path in self.opts.hang:
            self.hang(path)
            return
        if path not in GENERATION or self.opts.node_rank >= 1:  # rank > 0 serves no generation
            self.reply(404, "application/json", json.dumps({"detail": "Not Found"}))
            return
        try:
            body = json.loads(raw or b"{}")
            body = body if isinstance(body, dict) else {}
            asked(body, GENERATION[path])
        except (ValueError, TypeError) as exc:
            self.reply(400, "application/json", json.dumps({"detail": str(exc)}))
            return
        ready = time.time() - self.started_at >= self.opts.start_delay and self.opts.health_status == 200
        if not ready or not self.served.group_ready() or not self.served.begin():
            self.reply(503, "application/json", json.dumps({"detail": "the server is not ready"}))
            return
        try:
            if body.get("stream"):
                self.stream(body, GENERATION[path])
            else:
                self.reply(200, "application/json", json.dumps(generate(self.opts, self.served, body,
                                                                        GENERATION[path])))
        except ConnectionAbortedError:  # a rank lost (PeerLost), as SGLang dies with it: the answer ends midway
            self.close_connection = True

    def hang(self, path: str) -> None:
        """Never answer: wait until the caller closes the connection (its timeout acted), and log how
        long it waited, so a test can tell an honoured timeout from a late one."""
        arrived = time.monotonic()
        self.connection.settimeout(3600)
        try:
            while self.connection.recv(4096):
                pass
        except OSError:
            pass
        took = time.monotonic() - arrived
        sys.stderr.write(f"fake_sglang: hung {path}: arrived at {arrived:.3f}, "
                         f"closed by the client after {took:.3f}s\n")
        sys.stderr.flush()
        self.close_connection = True

    def stream(self, body: dict[str, Any], kind: str) -> None:
        """SSE as SGLang's StreamingResponse sends it (media type text/event-stream, chunked)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        rid = f"standin-{id(body):x}"
        final = generate(self.opts, self.served, body, kind,
                         lambda i, _meta: self.event(stream_chunk(self.opts, kind, rid, i, None)))
        if kind == "native":
            self.event(stream_chunk(self.opts, kind, rid, final["meta_info"]["completion_tokens"], final))
        else:
            self.event(stream_chunk(self.opts, kind, rid, 0, final))
            if (body.get("stream_options") or {}).get("include_usage"):
                self.event({"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                            "created": int(time.time()), "model": self.opts.model_path, "choices": [],
                            "usage": final["usage"]})
        self.chunk(b"data: [DONE]\n\n")
        self.chunk(b"")

    def event(self, doc: dict[str, Any]) -> None:
        self.chunk(b"data: " + json.dumps(doc).encode("utf-8") + b"\n\n")

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def reply(self, status: int, content_type: str, body: str) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt: str, *args: Any) -> None:
        if self.opts.verbose:
            sys.stderr.write(f"fake_sglang: {fmt % args}\n")


def make_handler(opts: argparse.Namespace, served: Served) -> type[BaseHTTPRequestHandler]:
    started_at = time.time()
    return type("Handler", (StandinHandler,), {"opts": opts, "served": served, "started_at": started_at,
                                               "table": routes(opts, started_at, served),
                                               "server_version": "fake-sglang/" + opts.version})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="TEST DOUBLE of an SGLang server's HTTP surface (no model, no GPU).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--version", default="0.5.23", help="reported as the SGLang version")
    p.add_argument("--spec-algorithm", default=None, help="e.g. DFLASH or DDTREE (none by default)")
    p.add_argument("--accept-length", type=float, default=3.2, help="tokens accepted per verify step")
    p.add_argument("--decode-tps", type=float, default=400.0, help="decode tokens per second of one request")
    p.add_argument("--prefill-delay", type=float, default=0.0, help="seconds before the first token (prefill)")
    p.add_argument("--enable-metrics", action="store_true", help="serve /metrics (as SGLang's flag)")
    p.add_argument("--start-delay", type=float, default=0.0, help="seconds /health answers 503 after start")
    p.add_argument("--bind-delay", type=float, default=0.0,
                   help="seconds before the port is bound (SGLang loads the model before it listens)")
    p.add_argument("--health-status", type=int, choices=(200, 503), default=200, help="/health once started")
    p.add_argument("--health-hang", action="store_true", help="/health accepts the request and never answers")
    p.add_argument("--hang", action="append", default=[], metavar="PATH",
                   help="a GET or POST of PATH is accepted and never answered (repeatable)")
    p.add_argument("--old-api", action="store_true", help="only /get_server_info and /get_model_info")
    p.add_argument("--hold-file", default=None,
                   help="test knob: a generation of the prompt 'hold' ends only once this file exists")
    p.add_argument("--model-path", default=DEFAULT_MODEL)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--node-rank", type=int, default=0, help="a multi-node server's rank (> 0: health only)")
    p.add_argument("--nnodes", type=int, default=1, help="a multi-node server's node count")
    p.add_argument("--dist-init-addr", default=None, help="HOST:PORT rank 0 listens on, the other ranks join")
    p.add_argument("--verbose", action="store_true", help="log requests on stderr")
    p.add_argument("--release-dir", default=None, help="release mode: report the release running from DIR")
    return p.parse_args(argv)


def serve(opts: argparse.Namespace, ready: threading.Event | None = None) -> None:
    """Serve until interrupted or drained; ``ready`` (a threading.Event) is set once the port is bound."""
    if opts.bind_delay > 0:
        time.sleep(opts.bind_delay)
    served = Served()
    if opts.nnodes > 1 and opts.dist_init_addr:  # one node of a multi-node server: its ranks join first
        served.join_group(opts.nnodes, opts.node_rank, opts.dist_init_addr)
    httpd = ThreadingHTTPServer((opts.host, opts.port), make_handler(opts, served))
    httpd.daemon_threads = True
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: drain(httpd, served))
    if ready is not None:
        ready.set()
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()


def drain(httpd: ThreadingHTTPServer, served: Served) -> None:
    """SIGTERM: /health and /ready 503, then exit once nothing is in flight, as SGLang's
    TokenizerManager.sigterm_watchdog (srt/managers/tokenizer_manager.py) waits for rid_to_state to
    empty. New generations are still admitted meanwhile, as SGLang admits them: a worker still in a
    gateway under load may not finish draining before its stop timeout (the drain through the gateway
    takes it out first)."""
    served.draining = True

    def wait_then_stop() -> None:
        while served.running:
            time.sleep(0.05)
        httpd.shutdown()

    threading.Thread(target=wait_then_stop, daemon=True).start()


def installed_release(opts: argparse.Namespace, launch: list[str]) -> argparse.Namespace:
    """Release mode: take version, algorithms and launch args from what is installed and asked."""
    import ast
    import importlib.util
    from importlib import metadata

    p = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)", allow_abbrev=False)
    p.add_argument("--model-path", default=opts.model_path)
    p.add_argument("--tp", "--tp-size", dest="tp", type=int, default=opts.tp)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--enable-metrics", action="store_true", default=opts.enable_metrics)
    p.add_argument("--node-rank", type=int, default=opts.node_rank)
    p.add_argument("--nnodes", type=int, default=opts.nnodes)
    p.add_argument("--dist-init-addr", default=opts.dist_init_addr)
    add_standin_flags(p, opts)
    args, _ = p.parse_known_args(launch)
    # SGLang's own flags are everything but the stand-in's: check them as the server would.
    checked_by = sglang_parser_check(sglang_flags(launch, opts))
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
    opts.hang = args.standin_hang
    opts.bind_delay, opts.hold_file = args.standin_bind_delay, args.standin_hold_file
    opts.decode_tps, opts.enable_metrics = args.standin_decode_tps, args.enable_metrics
    opts.prefill_delay, opts.node_rank = args.standin_prefill_delay, args.node_rank
    opts.nnodes, opts.dist_init_addr = args.nnodes, args.dist_init_addr
    opts.standin = {"release": os.path.basename(os.path.realpath(opts.release_dir)), "spec_algorithms": algorithms,
                    "launch_args": launch, "python": sys.executable, "args_checked_by": checked_by}
    return opts


def add_standin_flags(p: argparse.ArgumentParser, opts: argparse.Namespace) -> None:
    """The stand-in's own knobs among the launch args (fleetctl.release.service.without_standin
    leaves the same ones out of what SGLang's parser sees on the controller side)."""
    p.add_argument("--standin-health-status", type=int, default=opts.health_status)
    p.add_argument("--standin-accept-length", type=float, default=opts.accept_length)
    p.add_argument("--standin-decode-tps", type=float, default=opts.decode_tps)
    p.add_argument("--standin-prefill-delay", type=float, default=getattr(opts, "prefill_delay", 0.0))
    p.add_argument("--standin-start-delay", type=float, default=opts.start_delay)
    p.add_argument("--standin-bind-delay", type=float, default=opts.bind_delay)
    p.add_argument("--standin-health-hang", action="store_true", default=opts.health_hang)
    p.add_argument("--standin-hang", action="append", default=list(getattr(opts, "hang", [])), metavar="PATH")
    p.add_argument("--standin-hold-file", default=getattr(opts, "hold_file", None))


def sglang_flags(launch: list[str], opts: argparse.Namespace) -> list[str]:
    """The launch args without the stand-in's own ``--standin-*`` flags and their values."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_standin_flags(p, opts)
    return p.parse_known_args(launch)[1]


def sglang_parser_check(argv: list[str]) -> str:
    """Parse ``argv`` with the installed SGLang's own parser when it imports here: a rejection
    ends the stand-in with SGLang's message and exit code 2, as the server would end. Says which
    check ran."""
    try:
        from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]
    except BaseException as exc:  # a --no-deps venv: no torch, no numpy
        return f"spec_info.py only (sglang's parser does not import here: {type(exc).__name__})"
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    parser.parse_args(argv)  # exits 2 with "sglang serve: error: ..." on a flag SGLang does not know
    return "sglang.srt.server_args.ServerArgs.add_cli_args"


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
