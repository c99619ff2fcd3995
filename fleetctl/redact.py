"""The one redaction layer: every secret value the process learns is masked in everything it writes.

Secrets are registered where they are loaded, not where they are shown: a value decrypted from a
vault, a vault password, the inventory's secret variables (``secret_vars``, the password and
passphrase variables, values rendered from a vault; ``-e`` values are host variables too), the ``-K``
answer. The sinks mask with what is registered when they write: standard output and error (so rich
output, ``--json``, ``--events``, click's messages and the log handler's lines), run journals, crash
logs and the HTML pages. A new call site that prints or logs goes through them without a word.

As Ansible, a secret is shown as ``********``. A value shorter than ``MIN_LENGTH`` characters is not
registered (masking every "1" or "yes" in the output would garble it and tell nothing).
"""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, TextIO

MASK = "********"
MIN_LENGTH = 4
PENDING_LIMIT = 1 << 16  # a line longer than this is written in pieces (a secret across two may show)


class Registry:
    """The secret values of this process, each with the forms it takes in JSON and repr output."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: tuple[str, ...] = ()
        self._known: set[str] = set()

    def register(self, values: Iterable[Any]) -> None:
        new = {str(v) for v in values if isinstance(v, str) and len(v) >= MIN_LENGTH and v not in self._known}
        if not new:
            return
        with self._lock:  # longest first: a secret that holds another is masked whole
            self._known |= new
            forms = {form for value in new for form in _forms(value)}
            self._values = tuple(sorted({*self._values, *forms}, key=lambda v: (-len(v), v)))

    def clear(self) -> None:
        """Forget every secret (a new command in the same process: a test's in-process run)."""
        with self._lock:
            self._values, self._known = (), set()

    @property
    def values(self) -> tuple[str, ...]:
        return self._values

    def redact(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    def redact_obj(self, value: Any) -> Any:
        """Strings inside JSON-like data (mappings, lists, tuples) masked; a copy only where one changed."""
        if not self._values:
            return value
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self.redact_obj(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_obj(v) for v in value]
        return value


def _forms(value: str) -> set[str]:
    """The value as written, inside a JSON string and inside a Python repr (a log of a dict or a list)."""
    forms = {value, json.dumps(value)[1:-1], repr(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    return {f for f in forms if len(f) >= MIN_LENGTH}


REGISTRY = Registry()
register = REGISTRY.register
redact = REGISTRY.redact
redact_obj = REGISTRY.redact_obj


class RedactingStream(io.TextIOBase):
    """A text stream that masks secrets in what is written to it, line by line: a secret written in
    two pieces is still masked (text without a newline waits for the rest, or for a flush)."""

    def __init__(self, inner: TextIO, registry: Registry = REGISTRY) -> None:
        self.inner = inner
        self._registry = registry
        self._pending = ""
        self._lock = threading.RLock()

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            head, newline, tail = self._pending.rpartition("\n")
            if newline:
                self._pending = tail
                self.inner.write(self._registry.redact(head + newline))
            if len(self._pending) > PENDING_LIMIT:  # an endless line: out in pieces, not held (nor quadratic)
                self.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self.inner.write(self._registry.redact(self._pending))
                self._pending = ""
            self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.inner, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.inner, "errors", None)

    def __getattr__(self, name: str) -> Any:  # what else rich or click ask of a stream (``buffer``:
        return getattr(self.inner, name)  # bytes on purpose, as `vault decrypt` writes the plaintext)


class _RedactingFilter(logging.Filter):
    """A log record's message and traceback masked before any handler formats it (a log file too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if REGISTRY.values:
            record.msg, record.args = redact(record.getMessage()), None
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = redact(record.exc_text)
        return True


def install() -> Callable[[], None]:
    """Standard output and error masked, and every log handler filtered, from now on; returns what
    undoes it (an in-process caller's streams put back). Installed once: a second call does nothing."""
    if isinstance(sys.stdout, RedactingStream) and isinstance(sys.stderr, RedactingStream):
        return lambda: None
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    filter_log_handlers()

    def undo() -> None:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, RedactingStream):
                stream.flush()
        sys.stdout, sys.stderr = before
        for handler in logging.getLogger().handlers:
            handler.removeFilter(_LOG_FILTER)

    return undo


_LOG_FILTER = _RedactingFilter()


def filter_log_handlers() -> None:
    """Every handler of the root logger (where every logger's records end) masks secrets; call it
    again after adding a handler."""
    for handler in logging.getLogger().handlers:
        if _LOG_FILTER not in handler.filters:
            handler.addFilter(_LOG_FILTER)
