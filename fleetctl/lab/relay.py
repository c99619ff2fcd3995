"""The lab's latency: a TCP relay that holds every chunk it forwards for a fixed time, each way.

This machine's kernel has no sch_netem, so a lab host's delay is made in user space: the relay
listens on the host's own address (a port of its choosing) and an nf_tables DNAT rule of the lab
(fleetctl/lab/netfaults.py) sends every new connection to the host's ssh port there. The relay
connects on to the real sshd from the host's own address (which the rule leaves alone, so it is
not sent back to itself) and forwards each chunk ``delay`` seconds after it arrived, in order,
in both directions: a connection to that host sees its round trip grow by twice the delay.
Bytes are pipelined (a chunk does not wait for the one before it to be delivered), so the delay
does not cap the rate; a bounded queue passes back-pressure on to the sender.

Run as ``python -m fleetctl.lab.relay ADDRESS PORT DELAY_MS``: it binds, forks, prints
``<pid> <port>`` and returns; the forked relay runs until SIGTERM.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time

CHUNK = 65536
QUEUED = 512  # chunks held per direction (32 MiB): enough for 50 MB/s at 300 ms


def pump(src: socket.socket, dst: socket.socket, delay: float, done: threading.Event) -> None:
    """Forward src to dst, each chunk ``delay`` seconds after it arrived; EOF is forwarded as a
    half-close, an error anywhere ends both sockets."""
    held: queue.Queue[tuple[float, bytes]] = queue.Queue(QUEUED)
    broken = threading.Event()

    def hold(data: bytes) -> None:
        due = time.monotonic() + delay
        while not broken.is_set():
            try:
                return held.put((due, data), timeout=1)
            except queue.Full:
                continue

    def read() -> None:
        try:
            while data := src.recv(CHUNK):
                hold(data)
        except OSError:
            pass
        hold(b"")

    threading.Thread(target=read, daemon=True).start()
    try:
        while True:
            due, data = held.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                dst.shutdown(socket.SHUT_WR)
                break
            dst.sendall(data)
    except OSError:
        broken.set()
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
    done.set()


def serve_one(client: socket.socket, address: str, port: int, delay: float) -> None:
    try:
        upstream = socket.create_connection((address, port), timeout=30, source_address=(address, 0))
        upstream.settimeout(None)
    except OSError:
        client.close()
        return
    for sock in (client, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ends = [threading.Event(), threading.Event()]
    threading.Thread(target=pump, args=(client, upstream, delay, ends[0]), daemon=True).start()
    pump(upstream, client, delay, ends[1])
    ends[0].wait()
    client.close()
    upstream.close()


def main(argv: list[str]) -> int:
    address, port, delay = argv[0], int(argv[1]), float(argv[2]) / 1000
    listener = socket.create_server((address, 0), backlog=128)
    child = os.fork()
    if child:
        print(child, listener.getsockname()[1], flush=True)
        return 0
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve_one, args=(client, address, port, delay), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
