"""A stand-in load balancer for rollout tests: a small HTTP server on the controller that holds a pool
of host names. ``POST /drain/<host>`` takes a host out of the pool, ``POST /undrain/<host>`` puts it
back, ``GET /pool`` answers the pool as JSON; every request is logged in order."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class LoadBalancer:
    pool: set[str]
    url: str = ""
    log: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def load_balancer(hosts: list[str]) -> Iterator[LoadBalancer]:
    lb = LoadBalancer(set(hosts))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, status: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            with lb.lock:
                self._answer(200, sorted(lb.pool))

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            parts = self.path.strip("/").split("/")
            if len(parts) != 2 or parts[0] not in ("drain", "undrain"):
                self._answer(404, {"error": "no such endpoint"})
                return
            with lb.lock:
                lb.log.append(f"{parts[0]} {parts[1]}")
                (lb.pool.discard if parts[0] == "drain" else lb.pool.add)(parts[1])
                self._answer(200, {"pool": sorted(lb.pool)})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    lb.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield lb
    finally:
        server.shutdown()
        server.server_close()
