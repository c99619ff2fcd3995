"""Run many Ansible CLI calls for the comparison tests, each in its own fresh Ansible process.

Run by the pinned ansible-core venv's python: ``python ansible_zygote.py OUT_DIR < calls.json``,
calls being ``{key: [argv, env]}`` with argv[0] ``ansible`` or ``ansible-inventory``. Ansible's
modules are imported once here; each call is a forked child that runs the real CLI entry point
(``CLI.cli_executor``, what the installed scripts run) on that argv, its stdout and stderr in
OUT_DIR/<n>.out and .err. A child is exactly a new Ansible process after its imports, minus the
~1 s of them, so the answers are Ansible's own. Prints {key: [exit code, out file, err file]}.
"""

from __future__ import annotations

import json
import os
import sys

from ansible.cli.adhoc import AdHocCLI
from ansible.cli.inventory import InventoryCLI

CLIS = {"ansible": AdHocCLI, "ansible-inventory": InventoryCLI}


def child(argv: list[str], env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: stdout/stderr to the files, the CLI run, the exit code as ours."""
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file, fd)
        os.close(file)
    os.environ.update(env)
    code = 70
    try:
        sys.argv = [os.path.join(os.path.dirname(sys.executable), argv[0]), *argv[1:]]
        CLIS[argv[0]].cli_executor(sys.argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    out_dir = sys.argv[1]
    calls = json.load(sys.stdin)
    width = max(2, (os.cpu_count() or 2) * 2)
    running: dict[int, str] = {}
    results: dict[str, list] = {}
    pending = list(enumerate(calls.items()))

    def reap() -> None:
        pid, status = os.wait()
        results[running.pop(pid)][0] = os.waitstatus_to_exitcode(status)

    while pending or running:
        while pending and len(running) < width:
            n, (key, (argv, env)) = pending.pop(0)
            out, err = os.path.join(out_dir, f"{n}.out"), os.path.join(out_dir, f"{n}.err")
            results[key] = [None, out, err]
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                child(argv, env, out, err)
            running[pid] = key
        reap()
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
