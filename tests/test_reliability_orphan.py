"""Another process answering on the release's port never makes it look healthy.

An orphaned server from an earlier run (a killed test run, a hand-started server) answers /health
with 200 on the port the new release will use. Real SGLang binds its port only after loading the
model, so for a while the new server runs and has not bound it: the gate must count a 200 only from
a socket our server holds (remote/port_owner.py), not from whoever answers. The stand-in here binds
after 2 s (``--standin-bind-delay``), as SGLang does after loading; on lab1 the orphan already
holds the port, so the new server can never bind it there.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import LabHandle, process_gone
from reliability_support import assert_state_sound, assert_whole, fault_happened, tiny_releases, wait_until

from fleetctl.release.spec import load_spec

pytestmark = pytest.mark.lab
BODY = ("service: {standin: true, args: [--standin-bind-delay, '2']}\n"
        "health: {timeout: 12, interval: 0.2}\n")
ORPHAN = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"orphan")
    def log_message(self, *a):
        pass
http.server.HTTPServer((sys.argv[1], 30000), H).serve_forever()
"""


def test_a_200_from_another_process_on_the_port_is_not_healthy(
        scratch_lab: LabHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lab, inv = scratch_lab, str(scratch_lab.inventory_path)
    (spec,) = tiny_releases(lab, tmp_path, ["late-binder"], BODY)
    rid = load_spec(spec).release_id
    address = lab.addresses["lab1"]
    started = lab.ssh("lab1", f"setsid /usr/bin/python3 -c {shlex.quote(ORPHAN)} {address} "
                              "</dev/null >/dev/null 2>&1 & echo $!")
    orphan = int(started.stdout.strip())
    try:
        answered = wait_until(lambda: lab.ssh("lab1", f"/usr/bin/python3 -c \"import urllib.request as u; print("
                                                      f"u.urlopen('http://{address}:30000/health').read())\"",
                                              check=False).stdout.strip(), "the orphan answering on lab1:30000")
        fault_happened("orphan" in answered, f"another process answers /health on {address}:30000")
        r = run_cli(capsys, "-i", inv, "-l", "all", "deploy", str(spec), "--json")
        assert r.rc == 2, r.out + r.err
        hosts = r.json()["hosts"]
        assert hosts["lab2"]["status"] == "ok" and hosts["lab2"]["value"]["outcome"] == "deployed", hosts["lab2"]
        assert hosts["lab1"]["status"] == "failed", hosts["lab1"]
        gates = hosts["lab1"]["value"]["gates"] if hosts["lab1"].get("value") else []
        reason = " ".join([str(hosts["lab1"].get("reason"))] + [g.get("detail", "") for g in gates])
        # never "deployed": the gate waited while the new server loaded (the orphan's 200s did not
        # count) and failed when the server could not bind the port the orphan holds
        assert hosts["lab1"]["value"]["outcome"] == "failed-no-previous", hosts["lab1"]
        assert "Address already in use" in reason or "another process" in reason, hosts["lab1"]
    finally:
        lab.ssh("lab1", f"kill {orphan}; true")
    assert process_gone(orphan) or wait_until(lambda: process_gone(orphan), "the orphan ended")
    assert_state_sound(lab, "lab1")  # nothing half-switched, the lock free
    assert_whole(lab, "lab2", rid)
