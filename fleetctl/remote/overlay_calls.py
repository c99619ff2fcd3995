# Included by overlay_source.py and overlay_target.py (`# fleetctl-include: overlay_calls`): the listing
# calls a stream process answers before its work, so the controller lists a host over the same ssh
# connection that then carries the files (one OpenSSH process per host from the start, no agent and
# no child interpreter per call: a fresh overlay's first byte waits on neither).
# Frames in: 4-byte big-endian length + JSON. {"call": params}: main(params), answered on stdout as
# CALL_MAGIC + 4-byte length + {"ok": true, "result": ...} | {"ok": false, "error": {type, message}};
# any other frame is the process's work (the source's send list, the target's plan), returned.
# Stdlib only, Python >= 3.8.
import json
import os
import struct
import sys
import traceback

CALL_MAGIC = b"\x00FLEETCTL-OVERLAY-CALL\n"


def read_exact(fd, n):
    """n bytes from fd; b"" when it ends before the first byte; EOFError when it ends within them.
    Unbuffered: what follows the last frame (the target's tar) stays in the pipe for its reader."""
    got = b""
    while len(got) < n:
        chunk = os.read(fd, n - len(got))
        if not chunk:
            if got:
                raise EOFError("the controller's frame was cut short")
            return b""
        got += chunk
    return got


def read_frame(fd):
    """The next frame's JSON; None when the input ends between frames (nothing more asked)."""
    header = read_exact(fd, 4)
    if not header:
        return None
    size = struct.unpack(">I", header)[0]
    body = read_exact(fd, size) if size else b""
    if len(body) < size:
        raise EOFError("the controller's frame was cut short")
    return json.loads(body.decode("utf-8"))


def serve_calls(fd, main):
    """Answer each call frame with main(params) until a frame that is not a call, returned (None: the
    input ended, the controller needs no more of this host)."""
    out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else sys.stdout
    while True:
        doc = read_frame(fd)
        if doc is None or "call" not in doc:
            return doc
        try:
            answer = {"ok": True, "result": main(doc["call"])}
        except Exception as exc:  # the controller raises it as the agent's errors are raised
            answer = {"ok": False, "error": {"type": type(exc).__name__, "message": str(exc),
                                             "traceback": traceback.format_exc()[-4000:]}}
        data = json.dumps(answer).encode("utf-8")
        out.write(CALL_MAGIC + struct.pack(">I", len(data)) + data)
        out.flush()
