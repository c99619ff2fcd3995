"""The connection server's process: ``python -m fleetctl.transport.mux_main PATH PERSIST`` (started by ``mux.py``).
Here the server meets its batch operations, so neither module imports the other."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from fleetctl import redact
from fleetctl.transport.fdwait import raise_open_files_limit
from fleetctl.transport.mux import private_dir
from fleetctl.transport.mux_batch import serve_ping_many
from fleetctl.transport.mux_calls import serve_call_many
from fleetctl.transport.mux_server import MuxServer, log


def main(argv: list[str]) -> int:
    path, persist = Path(argv[0]), float(argv[1])
    redact.install()  # its log (stderr) masks every secret a request brings (mux.target_from_doc)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s mux[%(process)d] %(levelname)s %(message)s")
    private_dir(path.parent)
    raise_open_files_limit()  # it holds one connection per kept host
    try:
        return MuxServer(path, persist, {"ping_many": serve_ping_many, "call_many": serve_call_many}).serve()
    except OSError as exc:
        log.error("cannot serve on %s: %s", path, exc)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
