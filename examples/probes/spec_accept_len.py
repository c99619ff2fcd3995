"""The speculative decoding acceptance length a running SGLang server reports.

fleetctl probe script example. Reads GET /server_info (older SGLang: /get_server_info) from the
host itself and prints one JSON document:
  {"avg_spec_accept_length": 3.2, "speculative_algorithm": "DDTREE", "version": "0.5.23", ...}

Arguments (--arg key=value, all optional): port (default 30000), host (default 127.0.0.1),
timeout (seconds, default 5). Exits 1 with one line on stderr when the server does not answer.
Stdlib only, Python >= 3.8.
"""

import json
import os
import sys
import urllib.error
import urllib.request

args = json.loads(os.environ.get("FLEETCTL_ARGS") or "{}")
base = f"http://{args.get('host', '127.0.0.1')}:{args.get('port', '30000')}"
timeout = float(args.get("timeout", "5"))
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the host's own view, no proxy


def get_json(path):
    try:
        with opener.open(base + path, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


try:
    endpoint = "/server_info"
    info = get_json(endpoint)
    if info is None:  # older SGLang releases
        endpoint = "/get_server_info"
        info = get_json(endpoint)
except (OSError, ValueError) as exc:
    sys.exit(f"spec_accept_len: no server info from {base}: {exc}")
if info is None:
    sys.exit(f"spec_accept_len: {base} has neither /server_info nor /get_server_info")

states = info.get("internal_states") or [{}]
print(json.dumps({
    "avg_spec_accept_length": states[0].get("avg_spec_accept_length"),
    "speculative_algorithm": info.get("speculative_algorithm"),
    "speculative_num_draft_tokens": info.get("speculative_num_draft_tokens"),
    "version": info.get("version"),
    "endpoint": endpoint,
}))
