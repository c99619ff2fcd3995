# fleetctl-include: python_versions
"""Host facts, gathered ON the host: system, disks, Python interpreters, raw nvidia-smi output.

Stdlib only, Python >= 3.8. ``main(params)`` returns one JSON-able dict and never prints.
Parsing of nvidia-smi happens on the controller (fleetctl/gpu.py, gpu_logs.py): here we only
capture the raw text, rc and stderr so a failing driver is reported, not hidden: one
``nvidia-smi -q -x``, ``nvidia-smi nvlink --status`` (and ``-e`` where links exist), and the
kernel log's ``NVRM: Xid`` lines.

params (all optional):
  disk_paths:   paths whose filesystem free/total bytes are reported (default /, /opt, /var/lib)
  venv:         a venv folder; its bin/python is checked (exists? dangling link?) and pyvenv.cfg read
  nvidia_smi:   path of the nvidia-smi binary to use instead of searching (tests, odd installs)
  gpu_health:   also NVLink, ``topo -m`` (2 GPUs or more), the GPU processes' owners and the kernel log's
                Xid lines (default true; with gpu_only, default false)
  service_dir:  the service's pidfiles (fleetctl_state_dir/service): a GPU process under one is the server's
  cache_dir:    where each interpreter's version is remembered between runs (python_versions.py)
"""

import os
import sys
import time

# re, shutil, platform, socket, subprocess, threading, collections and concurrent.futures are
# imported where they are used: drift's GPU-only call on a host without nvidia-smi needs none of
# them (~45 ms of imports per host on every drift of a fleet). The patterns below are compiled
# (and cached by re) where they are used, for the same reason.

DEFAULT_DISK_PATHS = ("/", "/opt", "/var/lib")
SMI_TIMEOUT_S = 20.0
MAX_OUTPUT_CHARS = 200000  # nvidia-smi with many processes can be long; keep the JSON bounded
MAX_XML_CHARS = 4000000  # nvidia-smi -q -x of 8 GPUs is about 50 KB once supported_clocks is dropped
# The supported-clocks table is 80% of the XML and nothing reads it: dropped on the host.
SUPPORTED_CLOCKS = r"(?s)[ \t]*<supported_clocks>.*?</supported_clocks>\n?"
XID_MARK = "NVRM: Xid"
MAX_XID_LINES = 200  # the newest ones
UNREADABLE = r"(?i)insufficient permissions|not seeing messages from other users"


def main(params):
    params = params or {}
    if params.get("gpu_only"):  # drift needs the GPU stack alone: skip the slower discovery
        return {"schema": 2, "nvidia_smi": nvidia_smi(params.get("nvidia_smi"), bool(params.get("gpu_health")),
                                                      params.get("service_dir"))}
    import platform
    import socket

    disk_paths = params.get("disk_paths") or DEFAULT_DISK_PATHS
    answer = {
        "schema": 2,
        "hostname": socket.gethostname(),
        "os": os_release(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpus": cpu_counts(),
        "memory": meminfo(),
        "disks": dict((path, disk_usage(path)) for path in disk_paths),
        "interpreter": {
            "executable": sys.executable,
            "version": platform.python_version(),
            "full_version": sys.version,
        },
        "pythons": find_pythons(params.get("cache_dir")),
        "nvidia_smi": nvidia_smi(params.get("nvidia_smi"), params.get("gpu_health", True), params.get("service_dir")),
    }
    if params.get("venv"):
        answer["venv"] = venv_check(params["venv"])
    return answer


def os_release(path="/etc/os-release"):
    """PRETTY_NAME, ID and VERSION_ID of /etc/os-release; None when the file is missing."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            values[key.strip()] = value.strip().strip("'\"")
    return {
        "pretty_name": values.get("PRETTY_NAME"),
        "id": values.get("ID"),
        "version_id": values.get("VERSION_ID"),
    }


def cpu_counts():
    usable = None
    if hasattr(os, "sched_getaffinity"):
        try:
            usable = len(os.sched_getaffinity(0))
        except OSError:
            usable = None
    return {"count": os.cpu_count(), "usable": usable}


def meminfo(path="/proc/meminfo"):
    """MemTotal and MemAvailable in bytes (the file says kB, meaning KiB)."""
    import re
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = {}
    for line in lines:
        m = re.match(r"^(\w+):\s+(\d+)\s*(kB)?", line)
        if m:
            found[m.group(1)] = int(m.group(2)) * (1024 if m.group(3) else 1)
    return {"total": found.get("MemTotal"), "available": found.get("MemAvailable")}


def disk_usage(path):
    """Free (usable by non-root) and total bytes of the filesystem holding ``path``; None if absent."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return {"free": st.f_bavail * st.f_frsize, "total": st.f_blocks * st.f_frsize}


def which(name):
    """shutil.which(name) for a plain command name, without importing shutil (~10 ms of a host's
    CPU on every drift)."""
    search = os.environ.get("PATH", os.defpath)
    for folder in search.split(os.pathsep) if search else ():  # PATH="" finds nothing, as shutil.which
        path = os.path.join(folder, name)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


def find_nvidia_smi(override=None):
    if override:
        return override
    found = which("nvidia-smi")
    if found:
        return found
    for candidate in ("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi"):
        if os.path.exists(candidate):
            return candidate
    return None


def nvidia_smi(override=None, health=True, service_dir=None):
    """Raw ``nvidia-smi -q -x`` (and, with ``health``, NVLink state and counters, ``topo -m``, the GPU
    processes' owners and the kernel log's Xid lines); None when nvidia-smi is absent."""
    path = find_nvidia_smi(override)
    if path is None:
        return None
    xml = run_capture([path, "-q", "-x"], limit=MAX_XML_CHARS, strip=SUPPORTED_CLOCKS)
    answer = {"path": path, "xml": xml}
    if not health:
        return answer
    if xml["rc"] == 0 and "<gpu " in xml["stdout"]:
        status = run_capture([path, "nvlink", "--status"])
        answer["nvlink_status"] = status
        if status["rc"] == 0 and "Link " in status["stdout"]:  # only where NVLink exists
            answer["nvlink_errors"] = run_capture([path, "nvlink", "-e"])
        if xml["stdout"].count("<gpu ") > 1:  # pairs to connect
            answer["topo"] = run_capture([path, "topo", "-m"])
        answer["processes"] = process_owners(xml["stdout"], service_dir)
    answer["kernel_log"] = kernel_log()
    return answer


def process_owners(xml_text, service_dir):
    """The live pids of the service's pidfiles, and for each GPU process its ancestors and systemd
    unit (from /proc): the controller tells the release's server from other processes with them."""
    import re
    service_pids = []
    for name in sorted(os.listdir(service_dir)) if service_dir and os.path.isdir(service_dir) else []:
        pid = read_proc(os.path.join(service_dir, name)).split("\n")[0].strip() if name.endswith(".pid") else ""
        if pid.isdigit() and os.path.exists("/proc/" + pid):
            service_pids.append(int(pid))
    pids = {}
    for pid in sorted(set(re.findall(r"<pid>\s*(\d+)\s*</pid>", xml_text)), key=int)[:256]:
        unit = re.search(r"/([^/\s]+\.service)(?:/|\s|$)", read_proc("/proc/%s/cgroup" % pid))
        pids[pid] = {"found": os.path.exists("/proc/" + pid), "ancestors": ancestors(int(pid)),
                     "unit": unit.group(1) if unit else None}
    return {"service_pids": service_pids, "pids": pids}


def ancestors(pid, limit=64):
    chain = []
    while pid > 1 and len(chain) < limit:
        stat = read_proc("/proc/%d/stat" % pid)
        fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
        pid = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
        if pid > 0:
            chain.append(pid)
    return chain


def read_proc(path):
    try:
        with open(path) as f:
            return f.read(65536)
    except (OSError, UnicodeDecodeError):
        return ""


def kernel_log():
    """The kernel log's Xid lines of this boot: journalctl -k, else dmesg (with sudo -n when only root
    may read it). ``error`` says why none could be read; every line has its Unix time where known."""
    problems = []
    if which("journalctl"):
        lines, error = grep_command(["journalctl", "-k", "-b", "-o", "short-unix", "--no-pager"])
        if error is None:
            return {"source": "journalctl -k", "lines": [journal_line(t) for t in lines], "error": None}
        problems.append("journalctl -k: " + error)
    if which("dmesg"):
        up = uptime()
        boot = time.time() - up if up is not None else None
        argvs = [["dmesg"]]
        if os.geteuid() != 0 and which("sudo"):
            argvs.append(["sudo", "-n", "dmesg"])
        for argv in argvs:
            lines, error = grep_command(argv)
            if error is None:
                return {"source": " ".join(argv), "lines": [dmesg_line(t, boot) for t in lines], "error": None}
            problems.append(" ".join(argv) + ": " + error)
    else:
        problems.append("dmesg: not installed")
    return {"source": None, "lines": [], "error": "; ".join(problems) or "no kernel log reader"}


def journal_line(text):
    head, _, rest = text.partition(" ")
    try:
        return {"time": float(head), "text": rest}
    except ValueError:
        return {"time": None, "text": text}


def dmesg_line(text, boot):
    import re
    m = re.match(r"^\[\s*(\d+\.\d+)\]\s*(.*)$", text)
    if not m:
        return {"time": None, "text": text}
    return {"time": boot + float(m.group(1)) if boot is not None else None, "text": m.group(2)}


def uptime(path="/proc/uptime"):
    try:
        with open(path) as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def grep_command(argv, mark=XID_MARK, timeout=SMI_TIMEOUT_S, keep=MAX_XID_LINES):
    """The lines of ``argv``'s output holding ``mark`` (the newest ``keep``), read as a stream so a
    long kernel log is never held whole; (lines, None) or ([], why it could not be read)."""
    import collections
    import re
    import subprocess
    import threading
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    except OSError as exc:
        return [], str(exc)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines = collections.deque(maxlen=keep)
    try:
        for raw in proc.stdout:
            if mark.encode() in raw:
                lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
        stderr = proc.stderr.read().decode("utf-8", "replace")
        rc = proc.wait()
    finally:
        timer.cancel()
    if rc < 0:
        return [], "timed out after %gs" % timeout
    first = (stderr.strip().splitlines() or ["no output"])[0][:200]
    if rc != 0:
        return [], "exited %d: %s" % (rc, first)
    if re.search(UNREADABLE, stderr):  # journalctl as a user outside adm/systemd-journal: no kernel lines
        return [], first
    return list(lines), None


def run_capture(argv, timeout=SMI_TIMEOUT_S, limit=MAX_OUTPUT_CHARS, strip=None):
    """Run a command; rc None means it did not finish (timeout) or could not start (``error``)."""
    import subprocess
    result = {"argv": argv, "rc": None, "stdout": "", "stderr": "", "error": None}
    try:
        proc = subprocess.run(
            argv, capture_output=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        result["error"] = f"timed out after {timeout:g}s"
        return result
    except OSError as exc:
        result["error"] = str(exc)
        return result
    result["rc"] = proc.returncode
    stdout = proc.stdout.decode("utf-8", "replace")
    if strip is not None:
        import re
        stdout = re.sub(strip, "", stdout)
    result["stdout"] = stdout[:limit]
    if len(stdout) > limit:
        result["truncated"] = True
    result["stderr"] = proc.stderr.decode("utf-8", "replace")[-MAX_OUTPUT_CHARS:]
    return result


def venv_check(venv):
    """Does ``venv``/bin/python run here? A copied venv often links to a python this host lacks."""
    python = os.path.join(venv, "bin", "python")
    link_target = None
    if os.path.islink(python):
        try:
            link_target = os.readlink(python)
        except OSError:
            link_target = None
    return {
        "path": venv,
        "exists": os.path.isdir(venv),
        "python": python,
        "python_exists": os.path.exists(python),  # False for a dangling symlink too
        "python_executable": os.access(python, os.X_OK),
        "python_link": link_target,
        "pyvenv_cfg": read_pyvenv_cfg(os.path.join(venv, "pyvenv.cfg")),
    }


def read_pyvenv_cfg(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    cfg = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep:
            cfg[key.strip()] = value.strip()
    return cfg
