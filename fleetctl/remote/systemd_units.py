"""The service as systemd units (included by ``service_host``). Stdlib only, Python >= 3.8.

A unit file is written whole (renamed into place) into UNITS_DIR (default /etc/systemd/system) and
enabled the way ``systemctl enable`` does it for ``WantedBy=multi-user.target``: a link in
``multi-user.target.wants/``, made here so a host comes back serving after a reboot whether or not
systemctl may enable at this moment. An instance is its own unit file ``sglang@NAME.service``.
"""

import os

SYSTEMD_UNITS = "/etc/systemd/system"


def install_unit(units_dir, unit, text):
    """Write ``unit``'s file and its enable link; answers both paths."""
    path = os.path.join(units_dir, unit)
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.rename(path + ".tmp", path)
    wants = os.path.join(units_dir, "multi-user.target.wants")
    os.makedirs(wants, exist_ok=True)
    link = os.path.join(wants, unit)
    if os.path.realpath(link) != os.path.realpath(path):
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(path, link)
    return {"unit_file": path, "enabled": link}


def journal_tail(unit, lines=15):
    proc = run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"], check=False)
    return proc.stdout.splitlines()[-lines:] if proc.returncode == 0 else []


def systemd(op, params):
    unit = (params.get("name") or "sglang") + ".service"
    units_dir = params.get("units_dir") or SYSTEMD_UNITS
    if op != "status" and os.geteuid() != 0:  # systemctl on a system unit needs root
        if op in ("start", "restart") and params.get("unit"):
            require_writable([[os.path.join(units_dir, unit), "systemd unit", None]])
        raise NotPermitted("cannot %s %s as %s (systemctl needs root): run with --become (-b)"
                           % (op, unit, login_name()))
    if op in ("start", "restart") and params.get("unit"):
        install_unit(units_dir, unit, params["unit"])
        run(["systemctl", "daemon-reload"])
    if op == "status":
        proc = run(["systemctl", "is-active", unit], check=False)
        state = proc.stdout.strip()
        if not state:  # not even "unknown": systemd was not asked (no system bus for a non-root user)
            raise RuntimeError("systemd gave no answer: `systemctl is-active %s` exited %d: %s"
                               % (unit, proc.returncode, proc.stderr.strip()[-300:] or "nothing on stderr"))
        answer = dict(stored_fields(params), manager="systemd", running=state == "active", state=state,
                      enabled=os.path.lexists(os.path.join(units_dir, "multi-user.target.wants", unit)))
        if state != "active":  # what a failed gate shows: the unit's last journal lines
            answer["log_tail"] = journal_tail(unit)
        return answer
    run(["systemctl", op, unit])
    return {"manager": "systemd", "running": op != "stop"}
