"""The demo's gateway helpers: the lab inventory with ``router_url`` set for group lab, and a light
streaming load through the gateway for as long as a rollout runs, counted (tests/gateway_support's).

    python scripts/demo_gateway.py inventory LAB_INVENTORY GATEWAY_URL OUT   # prints the workers' URLs
    python scripts/demo_gateway.py load GATEWAY_URL MODEL                    # until SIGINT/SIGTERM
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import yaml  # noqa: E402
from gateway_support import streaming_load  # noqa: E402


def inventory(lab_inventory: str, url: str, out: str) -> int:
    doc = yaml.safe_load(Path(lab_inventory).read_text())
    lab = doc["all"]["children"]["lab"]
    lab.setdefault("vars", {})["router_url"] = url
    Path(out).write_text(yaml.safe_dump(doc, sort_keys=False))
    print(" ".join(f"http://{h.get('ansible_host', name)}:30000" for name, h in lab["hosts"].items()))
    return 0


def load(url: str, model: str) -> int:
    """Two clients streaming 20-token completions back to back, until told to stop; then the tally."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with streaming_load(url, clients=2, tokens=20, model=model) as tally:
        stop.wait()
    total = tally.completed + len(tally.failed) + len(tally.truncated)
    print(f"{total} streaming requests through the gateway during the rollout: {tally.completed} completed, "
          f"{len(tally.failed)} failed, {len(tally.truncated)} truncated")
    for problem in (tally.failed + tally.truncated)[:5]:
        print(f"  {problem}")
    return 0 if total and not tally.failed and not tally.truncated else 1


if __name__ == "__main__":
    what, *args = sys.argv[1:]
    sys.exit(inventory(*args) if what == "inventory" else load(*args))
