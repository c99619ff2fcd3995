"""Wait on this host until a TCP port or a path is in a state (``wait_for``). Stdlib only, Python >= 3.8.

params: host, port, path (one of port/path), state (started|stopped for a port; present|absent for a
path), timeout, delay, interval -> {"ok": bool, "elapsed": s, "state": what was last seen}
"""

import os
import socket
import time


def port_open(host, port):
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def main(params):
    time.sleep(float(params.get("delay") or 0))
    start = time.monotonic()
    deadline = start + float(params.get("timeout") or 300)
    interval = float(params.get("interval") or 0.5)
    state = params["state"]
    while True:
        if params.get("port") is not None:
            up = port_open(params.get("host") or "127.0.0.1", int(params["port"]))
            seen = "started" if up else "stopped"
        else:
            seen = "present" if os.path.exists(params["path"]) else "absent"
        if seen == state or time.monotonic() >= deadline:
            return {"ok": seen == state, "elapsed": round(time.monotonic() - start, 2), "state": seen}
        time.sleep(interval)
