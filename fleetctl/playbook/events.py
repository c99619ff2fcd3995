"""``fleetctl run --events``: the run's journal, line for line, on a stream (stdout) as it is written.

Each line is the journal's own (one JSON object: ``ts``, ``event`` and its fields, secret values
already masked by the journal's redactor), flushed at once so a CI job or a chat bot reading the
pipe sees each batch, task result, approval wait and rollback when it happens. A reader that goes
away (a closed pipe) ends the stream, never the run: the journal on disk stays complete.
"""

from __future__ import annotations

from typing import TextIO


class EventStream:
    def __init__(self, stream: TextIO) -> None:
        self._stream: TextIO | None = stream

    def __call__(self, line: str) -> None:
        if self._stream is None:
            return
        try:
            self._stream.write(line + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # the reader went away (EPIPE) or the stream closed
            self._stream = None
