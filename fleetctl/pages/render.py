"""The one HTML renderer of the fleet report and the drift report: strict Jinja2 (StrictUndefined,
autoescaping every value: host output is hostile input), one stylesheet (``report_templates/report.css``)
inlined into every page, so a page is one self-contained file with no external asset.
"""

from __future__ import annotations

import datetime as dt
import functools
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).resolve().parent / "templates"
LEVEL_TEXT = {"red": "RED", "amber": "AMBER", "green": "OK", "none": "-"}  # beside each colour, never colour alone


def when(ts: Any) -> str:
    """A Unix time as "2025-06-01 14:03 UTC" ("-" when unknown)."""
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


@functools.cache
def _environment() -> Any:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    from fleetctl import redact

    # finalize: every value a page shows has its secrets masked before it is escaped (redact.py)
    env = Environment(loader=FileSystemLoader(TEMPLATES), undefined=StrictUndefined, keep_trailing_newline=True,
                      autoescape=True,  # every template, whatever its name: nothing here is trusted text
                      finalize=lambda v: redact.redact(v) if isinstance(v, str) else v)
    env.filters.update(when=when, duration=duration, level_text=lambda lv: LEVEL_TEXT.get(str(lv), str(lv)))
    return env


def render(template: str, **context: Any) -> str:
    """A template error is a bug of ours, not bad input: it goes up as an internal error (the traceback,
    which names the template and its line, lands in the crash log)."""
    return str(_environment().get_template(template).render(**context))
