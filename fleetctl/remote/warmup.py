# Host side of the warm-up and canary records. Stdlib only, Python >= 3.8.
#
# op "measure": send `requests` generations to http://HOST:PORT/generate (SGLang's native API),
#   one after another, all within `timeout` seconds (a hanging server ends the warm-up), and read what SGLang says of each (meta_info: completion_tokens,
#   spec_verify_ct, spec_accept_length, e2e_latency). Answer:
#   {"requests", "ok", "errors": [...], "timed_out", "accept_length": tokens / verify steps or None,
#    "decode_tps": tokens / seconds of generation, "tokens", "seconds"}
# op "save": write the measurement as RELEASE_DIR/canary.json (atomically).
# op "load": {"found": bool, "measurement": {...}} from RELEASE_DIR/canary.json.
import json
import os
import socket
import time
import urllib.error
import urllib.request


def measure(params):
    """The generations, one after another, all within ``timeout`` seconds together: a request that
    gets no answer by then ends the warm-up ("timed_out"), the rest are not sent."""
    url = "http://%s:%s%s" % (params["host"], params["port"], params.get("path") or "/generate")
    body = json.dumps({"text": params.get("prompt") or "Hello", "sampling_params": {
        "max_new_tokens": int(params.get("max_tokens") or 64), "temperature": 0}}).encode()
    wanted = int(params.get("requests") or 1)
    timeout = float(params.get("timeout") or 120)
    deadline = time.monotonic() + timeout
    tokens = steps = ok = 0
    seconds = 0.0
    spec = timed_out = False
    errors = []
    for _ in range(wanted):
        start = time.monotonic()
        if start >= deadline:
            timed_out = True
            break
        try:
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=deadline - start) as answer:
                doc = json.loads(answer.read(1 << 22).decode("utf-8", "replace"))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if isinstance(exc, socket.timeout) or isinstance(getattr(exc, "reason", None), socket.timeout):
                timed_out = True
                break
            errors.append("%s: %s" % (type(exc).__name__, exc))
            continue
        took = time.monotonic() - start
        meta = doc.get("meta_info") if isinstance(doc, dict) else None
        if not isinstance(meta, dict) or "completion_tokens" not in meta:
            errors.append("no meta_info.completion_tokens in the answer")
            continue
        ok += 1
        n = int(meta["completion_tokens"])
        tokens += n
        seconds += float(meta.get("e2e_latency") or took)
        if meta.get("spec_verify_ct"):
            spec = True
            steps += int(meta["spec_verify_ct"])
    return {"requests": wanted, "ok": ok, "errors": errors[:5], "timed_out": timed_out, "tokens": tokens,
            "seconds": round(seconds, 4), "accept_length": round(tokens / steps, 4) if spec and steps else None,
            "decode_tps": round(tokens / seconds, 2) if seconds > 0 else None}


def record_path(params):
    name = params.get("instance")  # each instance of a release keeps its own measurement
    return os.path.join(params["release_dir"], "canary.%s.json" % name if name else "canary.json")


def save(params):
    path = record_path(params)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(params["measurement"], handle)
    os.replace(tmp, path)
    return {"saved": path}


def load(params):
    try:
        with open(record_path(params)) as handle:
            return {"found": True, "measurement": json.load(handle)}
    except (OSError, ValueError):
        return {"found": False, "measurement": None}


def main(params):
    return {"measure": measure, "save": save, "load": load}[params["op"]](params)
