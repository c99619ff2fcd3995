"""The service's files in a release folder (included by ``release_host``). Stdlib only, Python >= 3.8;
uses ``release_host``'s atomic_write and safe_join."""

import os
import shutil

# Written by `fleetctl lab` on its hosts (lab/reboot.py): the stand-in server is a test double that
# passes every gate without serving a model, so it is staged nowhere else.
LAB_MARKER = "/etc/fleetctl-lab/lab-host"
STANDIN_FILE = "sglang_standin.py"


class NotALabHost(Exception):
    """A spec with ``service.standin`` aimed at a host that is not one of fleetctl's lab hosts."""


def refuse_standin_off_the_lab(params):
    if STANDIN_FILE in (params.get("extra_files") or {}) and not os.path.exists(LAB_MARKER):
        raise NotALabHost("service.standin is for fleetctl's lab only, and this host is not a lab host "
                          "(no %s): remove standin from the spec" % LAB_MARKER)


def write_host_files(folder, params):
    """The service's files in a release folder: service.json (an instance's service.NAME.json), the
    stand-in (lab hosts only), service.env and each instance's service.NAME.env (0600)."""
    refuse_standin_off_the_lab(params)
    for name, text in (params.get("extra_files") or {}).items():
        atomic_write(safe_join(folder, name), text.encode("utf-8"), 0o644)
    envs = dict(params.get("env_files") or {}, **{"service.env": params.get("env_file") or ""})
    for name, text in sorted(envs.items()):  # an instance's own service.NAME.env beside service.env
        env = safe_join(folder, name)
        atomic_write(env, text.encode("utf-8"), 0o600)
        share_with_service_user(env, params.get("service_user"))


def share_with_service_user(path, user):
    """service.env readable by the service's own user (spec service.user): root:<its group> 0640.
    A user running the service as itself keeps it 0600, its own."""
    if not user:
        return
    import pwd

    entry = pwd.getpwnam(user)
    if entry.pw_uid == os.geteuid():
        return
    os.chown(path, 0, entry.pw_gid)
    os.chmod(path, 0o640)


# --- a serving release's configuration, changed in place (deploy's "reconfigured") -----------------
# The rendered command, env, unit and port of a release are per host: an inventory change (a rotated
# token, another --tp, a port) changes them without changing the release id. ``op_config`` rewrites them
# in the release folder, keeping what served before in RELEASE/.config-prev/ until the gates pass
# (commit) or fail (restore). While that folder exists the new files have not been judged: the next
# deploy restarts and gates again, whatever the files say.
PREV = ".config-prev"


def planned_host_files(params):
    """name -> bytes of every file write_host_files writes."""
    out = {name: text.encode("utf-8") for name, text in (params.get("extra_files") or {}).items()}
    envs = dict(params.get("env_files") or {}, **{"service.env": params.get("env_file") or ""})
    out.update((name, text.encode("utf-8")) for name, text in envs.items())
    return out


def read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def op_config(params):
    folder = safe_join(releases_dir(params), params["release_id"])
    prev = os.path.join(folder, PREV)
    mode = params["mode"]
    if not os.path.isfile(os.path.join(folder, "manifest.json")):
        raise RuntimeError("release %s is not on this host" % params["release_id"])
    if mode == "diff":
        planned = planned_host_files(params)
        changed = sorted(name for name, data in planned.items() if read_bytes(safe_join(folder, name)) != data)
        return {"changed": changed, "pending": os.path.isdir(prev)}
    if mode == "apply":
        if not os.path.isdir(prev):  # a pending change keeps the backup of what last served
            keep_previous_files(folder, prev, sorted(planned_host_files(params)))
        write_host_files(folder, params)
        return {"applied": True}
    if mode == "write":  # a release that does not serve (staged): no backup to keep
        if os.path.realpath(folder) == os.path.realpath(os.path.join(params["root"], "current")):
            raise RuntimeError("release %s is serving: its configuration changes through mode apply"
                               % params["release_id"])
        planned = planned_host_files(params)
        if all(read_bytes(safe_join(folder, name)) == data for name, data in planned.items()):
            return {"written": False}  # as staged: nothing to write (a full disk does not stop the switch)
        write_host_files(folder, params)
        return {"written": True}
    if mode == "restore":
        restored = restore_previous_files(folder, prev) if os.path.isdir(prev) else []
        return {"restored": restored}
    if mode == "commit":
        shutil.rmtree(prev, ignore_errors=True)
        return {"committed": True}
    raise ValueError("unknown config mode %r" % (mode,))


def keep_previous_files(folder, prev, names):
    tmp = prev + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp, mode=0o700)
    existed = []
    for name in names:
        source = safe_join(folder, name)
        if os.path.isfile(source):
            target = safe_join(tmp, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(source, target)  # mode kept: a 0600 service.env stays 0600
            st = os.stat(source)
            os.chown(target, st.st_uid, st.st_gid)
            existed.append(name)
    write_json(os.path.join(tmp, "index.json"), {"names": names, "existed": existed}, 0o600)
    os.rename(tmp, prev)  # whole or not at all


def restore_previous_files(folder, prev):
    index = read_json(os.path.join(prev, "index.json")) or {}
    existed = set(index.get("existed") or [])
    for name in index.get("names") or []:
        target = safe_join(folder, name)
        if name in existed:
            tmp = target + ".restore-tmp"
            shutil.copy2(safe_join(prev, name), tmp)
            st = os.stat(safe_join(prev, name))
            os.chown(tmp, st.st_uid, st.st_gid)
            os.replace(tmp, target)
        elif os.path.lexists(target):
            os.unlink(target)  # a file the new configuration added (another instance's env)
    shutil.rmtree(prev, ignore_errors=True)
    return sorted(index.get("names") or [])
