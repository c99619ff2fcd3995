"""HTML pages: the one strict Jinja2 renderer and its templates (fleet report, drift report)."""
