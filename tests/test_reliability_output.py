"""Hostile output from hosts: 100 MB, never ending, not UTF-8, binary, terminal escapes. The
controller's memory stays bounded (peak RSS of a real fleetctl process), -T ends the command and
everything it started on the host, naming the host; output stays readable and --json valid."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_support import run_cli, wall_clock
from lab_support import REPO, LabHandle, host_processes
from reliability_support import SEEN_LAG, assert_timeout_honoured, wait_until

pytestmark = pytest.mark.lab
FLEETCTL = str(Path(sys.executable).parent / "fleetctl")
MB = 1024 * 1024


# Runs fleetctl as ITS child and reports that child's peak RSS: measured from pytest's own fork,
# the figure would include pytest's memory image (the child holds it until exec).
LAUNCHER = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
            "sys.stderr.write('\\nRSS %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "sys.exit(rc)")


def _fleetctl(lab: LabHandle, *args: str) -> tuple[int, str, int]:
    """A real fleetctl process: exit code, stdout, and its peak RSS in bytes."""
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, FLEETCTL, "-i", str(lab.inventory_path), *args],
                          capture_output=True, text=True, cwd=REPO)
    rss = int(proc.stderr.strip().splitlines()[-1].split()[1]) * 1024
    return proc.returncode, proc.stdout, rss


def _timed_from_start(lab: LabHandle, host: str, marker: str, argv: list[str]) -> tuple[int, str, str, float]:
    """Run ``argv`` (a fleetctl process); exit code, stdout, stderr, and the seconds from the moment the
    test saw ``marker`` in a command line of ``host``'s processes (the command started there) to the
    process's exit: how long the command ran before -T ended it, by the test's clock."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        def still_running() -> None:
            assert proc.poll() is None, proc.communicate()

        def started() -> bool:
            return any(marker in _cmdline(pid) for pid in host_processes(lab, host))

        wait_until(started, f"{marker!r} started on {host}", timeout=60, interval=0.05, alive=still_running)
        seen = time.monotonic()
        out, err = proc.communicate(timeout=120)
        return proc.returncode, out, err, time.monotonic() - seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _no_process(marker: str) -> bool:
    """Lab hosts share this machine's pid namespace: nothing anywhere still runs ``marker``."""
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return found.stdout.strip() == ""


def test_shell_100mb_and_endless_output_bounded_and_ended_by_timeout(lab_fleet: LabHandle) -> None:
    rc, out, small = _fleetctl(lab_fleet, "-l", "lab1", "shell", "--json", "echo hi")
    assert rc == 0 and json.loads(out)["hosts"]["lab1"]["value"]["stdout"] == "hi\n"
    # 100 MB, then exit: the run completes with head and tail kept, the middle counted
    rc, out, big = _fleetctl(lab_fleet, "-l", "lab1,lab2", "shell", "--json",
                             "head -c 100000000 /dev/zero | tr '\\0' x; echo; echo END")
    doc = json.loads(out)
    assert rc == 0, doc
    text = doc["hosts"]["lab1"]["value"]["stdout"]
    assert text.startswith("xxxx") and text.endswith("x\nEND\n")
    assert "bytes of output left out]" in text and len(text) < 2 * MB
    assert big < small + 40 * MB < 150 * MB, (small, big)
    # never ends, prints without end, and starts a child that would outlive it: -T ends all of it
    rc, out, err, waited = _timed_from_start(
        lab_fleet, "lab1", "sleep 3797",
        [sys.executable, "-c", LAUNCHER, FLEETCTL, "-i", str(lab_fleet.inventory_path), "-T", "3", "-l", "lab1,lab2",
         "shell", "--json", 'if [ "$(hostname)" = lab1 ]; then sleep 3797 & yes fleetctl-flood; fi; echo quick'])
    endless = int(err.strip().splitlines()[-1].split()[1]) * 1024
    # the timeout ended it (and the group's kill, TERM then KILL a second later), not the command (an hour)
    assert_timeout_honoured(waited, 3, "shell -T 3 on a flood", lag=SEEN_LAG)
    doc = json.loads(out)["hosts"]
    assert rc == 2
    assert doc["lab1"]["status"] == "failed" and "timed out" in doc["lab1"]["reason"]
    assert doc["lab2"]["status"] == "ok" and doc["lab2"]["value"]["stdout"] == "quick\n"
    assert endless < small + 40 * MB, (small, endless)
    assert _no_process("sleep 3797") and _no_process("yes fleetctl-flood")
    _, out, err, waited = _timed_from_start(lab_fleet, "lab1", "sleep 3798", [
        FLEETCTL, "-i", str(lab_fleet.inventory_path), "-T", "2", "-l", "lab1", "shell", "sleep 3798"])
    assert_timeout_honoured(waited, 2, "shell -T 2", lag=SEEN_LAG)
    human = out + err
    assert "lab1" in human and "timed out" in human
    assert _no_process("sleep 3798")


def test_probe_script_flood_bounded_and_timeout(lab_fleet: LabHandle, tmp_path: Path) -> None:
    tiny = tmp_path / "tiny.py"
    tiny.write_text("print('hi')\n")
    rc, out, small = _fleetctl(lab_fleet, "-l", "lab1", "probe", "script", str(tiny), "--json")
    assert rc == 0 and json.loads(out)["hosts"]["lab1"]["value"]["text"] == "hi\n"
    flood = tmp_path / "flood.py"
    flood.write_text("import sys\nfor _ in range(100):\n    sys.stdout.write('y' * 1000000)\nprint('END')\n")
    rc, out, big = _fleetctl(lab_fleet, "-l", "lab1", "probe", "script", str(flood), "--json")
    doc = json.loads(out)["hosts"]["lab1"]
    assert rc == 0, doc
    assert doc["value"]["stdout_truncated"] is True and len(doc["value"]["text"]) == MB
    hang = tmp_path / "hang.py"
    hang.write_text("import time\nprint('started', flush=True)\ntime.sleep(3799)\n")
    rc, out, _, waited = _timed_from_start(lab_fleet, "lab1", "hang.py", [
        FLEETCTL, "-i", str(lab_fleet.inventory_path), "-T", "2", "-l", "lab1", "probe", "script", str(hang), "--json"])
    assert_timeout_honoured(waited, 2, "probe script -T 2", lag=SEEN_LAG)
    doc = json.loads(out)["hosts"]["lab1"]
    assert rc == 2 and doc["reason"] == "timed out after 2s (killed)"
    assert doc["value"]["text"] == "started\n"
    assert _no_process("hang.py")  # the script (its command line names it) ended with its group
    assert big < small + 40 * MB, (small, big)


BINARY = "printf 'ok \\377\\376 nul:\\000 esc:\\033[2J bell:\\007 caf\\303\\251\\n'"


def test_binary_and_non_utf8_output_readable_and_valid_json(lab_fleet: LabHandle, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    inv = str(lab_fleet.inventory_path)
    expected = "ok \\xff\\xfe nul:\\x00 esc:\\x1b[2J bell:\\x07 café\n"
    r = run_cli(capsys, "-i", inv, "-l", "lab1", "shell", "--json", BINARY + " >&2; " + BINARY)
    assert r.rc == 0, r.err
    value = r.json()["hosts"]["lab1"]["value"]
    assert value["stdout"] == expected and value["stderr"] == expected
    human = run_cli(capsys, "-i", inv, "-l", "lab1", "shell", BINARY)
    assert expected.strip() in human.out and "\x1b[2J" not in human.out and "\x00" not in human.out
    script = tmp_path / "binary.py"
    script.write_text(textwrap.dedent("""\
        import sys
        sys.stdout.buffer.write(b"ok \\xff\\xfe nul:\\x00 esc:\\x1b[2J bell:\\x07 caf\\xc3\\xa9\\n")
        sys.stderr.buffer.write(b"\\x1b]0;title\\x07warn \\xff\\n")
        """))
    p = run_cli(capsys, "-i", inv, "-l", "lab1,lab2", "probe", "script", str(script), "--json")
    assert p.rc == 0, p.err
    for host in ("lab1", "lab2"):
        v = p.json()["hosts"][host]["value"]
        assert v["text"] == expected and v["stderr"] == "\\x1b]0;title\\x07warn \\xff\n"
    human = run_cli(capsys, "-i", inv, "-l", "lab1", "probe", "script", str(script))
    assert human.rc == 0 and expected.strip() in human.out and "\x1b" not in human.out + human.err


def test_local_connection_bounds_output_and_kills_the_group_at_the_timeout() -> None:
    """``ansible_connection: local`` behaves as SSH does: bounded capture, the whole group killed."""
    from fleetctl.errors import CommandError
    from fleetctl.transport.local import LocalConnector

    here = LocalConnector("here")
    r = here.run("head -c 50000000 /dev/zero | tr '\\0' x; printf '\\377 \\033[2J\\n' >&2")
    assert r.rc == 0 and r.stdout.startswith("xxx") and "bytes of output left out]" in r.stdout
    assert len(r.stdout) < 2 * MB and r.stderr == "\\xff \\x1b[2J\n"
    with wall_clock() as took, pytest.raises(CommandError, match="timed out"):
        here.run("sleep 3803 & yes fleetctl-local-flood", timeout=1)
    assert_timeout_honoured(took.seconds, 1, "a local command with a 1 s timeout")
    assert _no_process("sleep 3803") and _no_process("yes fleetctl-local-flood")
