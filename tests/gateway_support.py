"""The real gateway (``smg``, installed by ``make deps`` from PyPI) and stand-in servers for tests:
start them as processes, and stream generations through them counting what came back."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAKE_SGLANG = REPO / "fleetctl" / "lab" / "fake_sglang.py"
# The Makefile's smg tool venv (outside the checkout, one per machine); FLEETCTL_SMG overrides.
MODEL = "Qwen/Qwen3.6-35B-A3B"  # the stand-in's default --model-path
SMG = Path(os.environ.get("FLEETCTL_SMG", "/var/cache/fleetctl-tools/smg-1.13.0/bin/smg"))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], seconds: float = 60) -> None:
    """Until ``url`` answers anything (a 503 counts: the server listens)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answered at {url}")


@contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started by a test, each ended by its own pid afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


def start_stand_in(procs: list[subprocess.Popen[bytes]], *args: str) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(FAKE_SGLANG), "--host", "127.0.0.1", "--port", str(port), *args])
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc)
    return url, proc


def start_gateway(procs: list[subprocess.Popen[bytes]], log: Path, workers: list[str] = ()) -> str:  # type: ignore[assignment]
    """The real smg on a free port, round robin, its Prometheus on another free port of loopback (its
    default is every interface)."""
    assert SMG.exists(), f"{SMG} is missing: run make deps (it installs smg 1.13.0 from PyPI)"
    port = free_port()
    argv = [str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warn"]
    if workers:
        argv += ["--worker-urls", *workers]
    proc = subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/workers", proc)
    return url


def sse_events(body: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[len("data: "):] for line in body.decode().split("\n\n") if line.startswith("data: ")]


@dataclass
class Tally:
    """What a streaming load saw: completed in full, failed (no 200), truncated (fewer tokens)."""

    completed: int = 0
    failed: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def stream_once(base: str, tokens: int, timeout: float = 120, model: str = MODEL,
                prompt: str = "hi") -> tuple[int, str]:
    """One streaming /v1/completions through ``base``: (tokens received, problem or ''). smg 1.13.0
    routes by ``model`` (the workers' served model name; an unknown one is 404 model_not_found)."""
    host, _, port = base.removeprefix("http://").partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": tokens, "stream": True})
    cut = ""
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        try:
            raw = answer.read()
        except (OSError, http.client.HTTPException) as exc:  # the stream broke midway: what came counts
            raw, cut = getattr(exc, "partial", b"") or b"", f"stream cut: {type(exc).__name__}"
    except (OSError, http.client.HTTPException) as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    if answer.status != 200:
        return 0, f"HTTP {answer.status}: {raw[:200]!r}"
    events = sse_events(raw)
    got, error = 0, ""
    for event in events:
        if event == "[DONE]":
            continue
        try:
            doc = json.loads(event)
        except ValueError:
            error = error or f"stream event not JSON: {event[:200]!r}"
            continue
        if "error" in doc or "choices" not in doc:  # the gateway's error event when its upstream broke
            error = error or f"stream error: {event[:200]}"
        elif doc["choices"] and doc["choices"][0].get("text"):
            got += 1
    return got, cut or error or ("" if events and events[-1] == "[DONE]" else "no [DONE]")


@contextmanager
def streaming_load(base: str, clients: int = 4, tokens: int = 40, model: str = MODEL) -> Iterator[Tally]:
    """``clients`` threads streaming back to back through ``base`` until the block ends."""
    tally, stop = Tally(), threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                got, problem = stream_once(base, tokens, model=model)
            except Exception as exc:  # never a client lost silently: whatever broke is a failed request
                got, problem = 0, f"client error: {exc!r}"
            if problem and not got and not problem.startswith("stream cut"):
                stop.wait(0.1)  # a client that failed tries again a little later, not in a tight loop
            with tally.lock:
                if problem and not got and not problem.startswith("stream cut"):
                    tally.failed.append(problem)
                elif got != tokens or problem:
                    tally.truncated.append(f"{got} of {tokens} tokens {problem}".strip())
                else:
                    tally.completed += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield tally
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=180)
