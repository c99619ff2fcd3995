"""Small helpers for remote output: decode safely, keep the tail."""

from __future__ import annotations


def tail_text(data: bytes | str, lines: int = 5, max_chars: int = 2000) -> str:
    """The last few lines of some output, decoded without ever failing."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    tail = "\n".join(text.rstrip().splitlines()[-lines:])
    return tail[-max_chars:]
