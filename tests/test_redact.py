"""The redaction layer (fleetctl/redact.py) at each sink, without hosts: what a user would find in
the terminal, --json, a log line, a crash log and an HTML page once a secret is known.
End to end over a whole lab story: tests/test_e2e_secrets_redacted.py."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
import yaml
from cli_support import run_cli

from fleetctl import redact, render
from fleetctl.redact import MASK, RedactingStream, Registry

SECRET = 'tok-"quoted"\\back-é-1234'  # JSON and repr escape it: masked in those forms too


def test_short_values_are_not_registered_and_longest_wins() -> None:
    reg = Registry()
    reg.register(["abc", "", "abcd-secret", "abcd-secret-longer", None])  # type: ignore[list-item]
    assert reg.redact("abc abcd-secret abcd-secret-longer") == f"abc {MASK} {MASK}"


def test_json_and_repr_forms_are_masked() -> None:
    redact.register([SECRET])
    for text in (SECRET, json.dumps({"v": SECRET}), repr({"v": SECRET}), json.dumps(SECRET, ensure_ascii=False)):
        assert SECRET not in redact.redact(text) and MASK in redact.redact(text), text
    assert redact.redact_obj({"a": [SECRET, 1, None], "b": (f"x{SECRET}y",)}) == {"a": [MASK, 1, None],
                                                                                 "b": [f"x{MASK}y"]}


def test_a_secret_written_in_pieces_is_masked() -> None:
    redact.register([SECRET])
    out = io.StringIO()
    stream = RedactingStream(out)
    stream.write("before " + SECRET[:5])
    stream.write(SECRET[5:] + " after\nnext ")
    stream.flush()
    assert out.getvalue() == f"before {MASK} after\nnext "


def test_a_folded_table_cell_and_a_styled_text_are_masked_before_layout() -> None:
    from rich.console import Console
    from rich.text import Text

    long = "sk-" + "0123456789abcdef" * 4
    redact.register([long])
    out = io.StringIO()
    console = Console(file=out, width=30, color_system=None)
    console.print(render.table(None, ["host", "value"], [["gpu1", f"key={long}"]]))
    printed = render.masked_renderable(Text.assemble(("host ", "bold"), (f"has {long} here", "red")))
    console.print(printed)
    assert "0123456789" not in out.getvalue() and "****" in out.getvalue(), out.getvalue()
    assert printed.plain == f"host has {MASK} here" and printed.spans  # styles kept


def test_html_pages_mask_values_before_escaping() -> None:
    from fleetctl.pages.render import _environment

    redact.register(["<b>&secret-html"])
    page = _environment().from_string("<p>{{ x }}</p>").render(x="log: <b>&secret-html done")
    assert page == f"<p>log: {MASK} done</p>"


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    """Two local hosts with the same ``token``; only gpu1 lists it in ``secret_vars``."""
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump({"all": {"vars": {"token": SECRET}, "hosts": {
        "gpu1": {"ansible_connection": "local", "secret_vars": ["token"]},
        "gpu2": {"ansible_connection": "local"}}}}))
    return path


def test_a_secret_of_one_host_is_masked_everywhere_and_in_json(inventory: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "-i", str(inventory), "hosts", "--json")
    assert r.rc == 0, r.err
    hosts = {h["name"]: h["vars"] for h in r.json()["hosts"]}
    assert hosts["gpu1"]["token"] == hosts["gpu2"]["token"] == MASK
    assert SECRET not in r.out and json.dumps(SECRET)[1:-1] not in r.out
    table = run_cli(capsys, "-i", str(inventory), "hosts")
    assert SECRET not in table.out + table.err


def test_the_crash_log_and_the_internal_error_line_are_masked(inventory: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(doc: object) -> None:
        raise RuntimeError(f"cannot show {SECRET}")

    monkeypatch.setenv("FLEETCTL_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(render, "emit_json", broken)  # a bug of ours whose message holds a secret
    r = run_cli(capsys, "-i", str(inventory), "hosts", "--json")
    assert r.rc == 4 and f"internal error: RuntimeError: cannot show {MASK}" in r.err, r.err
    [crash] = (tmp_path / "logs").glob("crash-*.log")
    text = crash.read_text()
    assert "Traceback" in text and f"cannot show {MASK}" in text and SECRET not in text


def test_log_records_are_masked_at_every_handler() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logging.getLogger().addHandler(handler)
    try:
        redact.filter_log_handlers()
        redact.register([SECRET])
        logging.getLogger("fleetctl.test").warning("sent %s", {"password": SECRET})
    finally:
        logging.getLogger().removeHandler(handler)
    assert SECRET not in out.getvalue() and repr(SECRET)[1:-1] not in out.getvalue()
    assert f"'password': '{MASK}'" in out.getvalue(), out.getvalue()
