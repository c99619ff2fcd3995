"""Small helpers for remote output: decode safely, keep the tail."""

from __future__ import annotations


def tail_text(data: bytes | str, lines: int = 5, max_chars: int = 2000) -> str:
    """The last few lines of some output, decoded without ever failing."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    tail = "\n".join(text.rstrip().splitlines()[-lines:])
    return tail[-max_chars:]


MAX_CAPTURE = 1024 * 1024  # bytes of each stream a remote command keeps: the head and the tail halves


class BoundedCapture:
    """A stream's bytes in bounded memory: the first and last ``limit // 2`` bytes, and how many
    were dropped between them (a command printing 100 MB costs the controller ``limit`` bytes)."""

    def __init__(self, limit: int = MAX_CAPTURE) -> None:
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        extra = len(self.tail) - self.half
        if extra > 0:
            del self.tail[:extra]
            self.dropped += extra

    def text(self) -> str:
        if not self.dropped:
            return readable(bytes(self.head + self.tail))
        return (readable(bytes(self.head)) + f"\n[fleetctl: {self.dropped} bytes of output left out]\n"
                + readable(bytes(self.tail)))


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F)}
_CONTROL.update({c: f"\\x{c:02x}" for c in range(0x80, 0xA0)})


def readable(data: bytes) -> str:
    """Host output as safe text: bytes that are not UTF-8 become ``\\xNN``, and so do control
    characters other than newline, tab and carriage return (no terminal escapes reach the screen)."""
    return printable(data.decode("utf-8", "backslashreplace"))


def printable(text: str) -> str:
    """Control characters other than newline, tab and carriage return as ``\\xNN``."""
    return text.translate(_CONTROL)
