# fleetctl-include: relocate
# fleetctl-include: writable
# The host side of `fleetctl venv create`, run by the agent's own python.
#
# Stdlib only, Python >= 3.8. Actions:
#   inspect: {venv, python: "3.11"|None, wheelhouse, wheels: [file name]} -> the interpreter that
#     `python3.X` (or python3) names, uv if installed, the venv's python version and installed
#     distributions, and the sha256 of each wanted wheel already in the wheelhouse. Read-only.
#   prepare: {wheelhouse} -> makes the wheelhouse folder (uploads land there over SFTP).
#   apply: {venv, python, create, installer: "uv"|"pip", uv, install: [spec], no_deps, remove: [name],
#     wheelhouse|None, wheels: {file name: sha256}} -> creates the venv, removes, installs (offline
#     from the wheelhouse when given), after checking the uploaded wheels' hashes.
import email.parser
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time

WHEELHOUSE = "/var/lib/fleetctl/wheelhouse"


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def find_python(version):
    name = "python%s" % version if version else "python3"
    path = shutil.which(name) or (os.path.exists("/usr/bin/" + name) and "/usr/bin/" + name) or None
    if not path:
        return None, None
    out = subprocess.run([path, "-c", "import sys;print('%d.%d.%d' % sys.version_info[:3])"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return path, out.stdout.decode().strip() or None


def find_uv():
    found = shutil.which("uv")
    for candidate in ([found] if found else []) + [os.path.expanduser("~/.local/bin/uv"),
                                                   os.path.expanduser("~/.cargo/bin/uv")]:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def venv_version(venv):
    """The venv's python version from pyvenv.cfg (venv writes `version`, uv `version_info`)."""
    try:
        with open(os.path.join(venv, "pyvenv.cfg"), "r") as handle:
            for line in handle:
                key, _, value = line.partition("=")
                if key.strip() in ("version", "version_info"):
                    return value.strip()
    except (IOError, OSError):
        pass
    return None


def installed(venv):
    dists = {}
    for folder in sorted(glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "*.dist-info"))):
        try:
            with open(os.path.join(folder, "METADATA"), "r", encoding="utf-8", errors="replace") as handle:
                msg = email.parser.HeaderParser().parsestr(handle.read())
        except (IOError, OSError):
            continue
        if msg.get("Name"):
            dists[normalize(msg.get("Name"))] = msg.get("Version") or "?"
    return dists


def inspect(params):
    venv = params["venv"]
    python, version = find_python(params.get("python"))
    house = params.get("wheelhouse") or WHEELHOUSE
    wheels = {}
    for name in params.get("wheels") or []:
        path = os.path.join(house, name)
        wheels[name] = wheel_sha256(path) if os.path.isfile(path) else None
    exists = os.path.exists(os.path.join(venv, "bin", "python"))
    return {"python": python, "python_version": version, "uv": find_uv(), "venv_exists": exists,
            "venv_version": venv_version(venv) if exists else None, "installed": installed(venv) if exists else {},
            "wheels": wheels}


def wheel_sha256(path):
    """sha256 of a wheel, remembered by this agent (AGENT_MEMO) while its stat is the same: inspect
    and apply of one run read a 4 GB wheelhouse once, not twice."""
    st = os.stat(path)
    memo = globals().get("AGENT_MEMO")
    key = ("wheel_sha256", path, st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
    if memo is not None and key in memo:
        return memo[key]
    digest = file_sha256(path)
    if memo is not None:
        memo[key] = digest
    return digest


def run(argv, log):
    started = time.time()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ, PIP_NO_INPUT="1"))
    log.append({"argv": argv, "rc": proc.returncode, "seconds": round(time.time() - started, 2)})
    if proc.returncode != 0:
        tail = " | ".join(proc.stdout.decode("utf-8", "replace").strip().splitlines()[-6:])
        raise RuntimeError("`%s` exited %d: %s" % (" ".join(argv), proc.returncode, tail))


def check_wheels(house, wheels):
    for name, want in sorted((wheels or {}).items()):
        path = os.path.join(house, name)
        if not os.path.isfile(path) or wheel_sha256(path) != want:
            raise RuntimeError("wheel %s in %s does not have the uploaded hash (interrupted upload?)" % (name, house))


def commands(params, reqfile):
    venv, uv, house = params["venv"], params.get("uv"), params.get("wheelhouse")
    vpy = os.path.join(venv, "bin", "python")
    offline = ["--no-index", "--find-links", house] if house else []
    deps = ["--no-deps"] if params.get("no_deps") else []
    out = []
    if params.get("installer") == "uv":
        if params.get("create"):
            out.append([uv, "venv", "--quiet", "--python", params["python"], venv])
        if params.get("remove"):
            out.append([uv, "pip", "uninstall", "--quiet", "--python", vpy] + params["remove"])
        if params.get("install"):
            out.append([uv, "pip", "install", "--quiet", "--python", vpy, "-r", reqfile] + deps
                       + (["--offline"] + offline if house else []))
        return out
    if params.get("create"):
        out.append([params["python"], "-m", "venv", venv])
    if params.get("remove"):
        out.append([vpy, "-m", "pip", "uninstall", "-y", "-q"] + params["remove"])
    if params.get("install"):
        no_compile = ["--no-compile"] if params.get("no_compile") else []  # uv compiles nothing unless asked
        out.append([vpy, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", reqfile] + deps + offline
                   + no_compile)
    return out


def require_venv_writable(params, house=None):
    """The venv (or the folder it will be made in) and the wheelhouse, before anything is written."""
    targets = [[params["venv"], "the venv", None]] if params.get("venv") else []
    if house:
        targets.append([house, "wheelhouse", "fleetctl_state_dir"])
    require_writable(targets)


def apply(params):
    house = params.get("wheelhouse")
    require_venv_writable(params, house)
    if house:
        check_wheels(house, params.get("wheels"))
    log = []
    handle, reqfile = tempfile.mkstemp(prefix="fleetctl-req-", suffix=".txt")
    try:
        with os.fdopen(handle, "w") as out:
            out.write("\n".join(params.get("install") or []) + "\n")
        for argv in commands(params, reqfile):
            run(argv, log)
    finally:
        os.unlink(reqfile)
    return {"commands": log}


def main(params):
    action = (params or {}).get("action")
    if action == "inspect":
        return inspect(params)
    if action == "prepare":
        house = params.get("wheelhouse") or WHEELHOUSE
        require_venv_writable(params, house)  # uploads come next: refuse before the first
        if not os.path.isdir(house):
            os.makedirs(house)
        return {"wheelhouse": house}
    if action == "apply":
        return apply(params)
    raise ValueError("unknown action %r" % (action,))
