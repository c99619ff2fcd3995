# bench job "ping": what `fleetctl ping` learns from a host (reachable, its name, its Python),
# as one JSON line. Run by every tool as `python3` on every host.
import json
import platform
import sys

print(json.dumps({"hostname": platform.node(), "python": sys.executable,
                  "python_version": ".".join(str(n) for n in sys.version_info[:3])}))
