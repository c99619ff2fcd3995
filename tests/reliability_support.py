"""Checks shared by the reliability tests: is a host's release whole, what runs there."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from lab_support import LabHandle

# On the host: what `current` names, whether that release is whole (every patched/added file
# matches the manifest's sha256, every file of the base venv is in the release's venv), and what
# temporary files are left.
_CHECK = textwrap.dedent("""\
    import hashlib, json, os, sys
    root, base = sys.argv[1], sys.argv[2]
    out = {"current": None, "bad": [], "missing": [], "temps": [], "env_mode": None}
    rels = os.path.join(root, "releases")
    out["temps"] = sorted(n for n in (os.listdir(rels) if os.path.isdir(rels) else []) if n.startswith("."))
    out["temps"] += sorted(n for n in (os.listdir(root) if os.path.isdir(root) else []) if ".tmp-" in n)
    try:
        rel = os.path.join(root, os.readlink(os.path.join(root, "current")))
    except OSError:
        print(json.dumps(out)); sys.exit(0)
    out["current"] = os.path.basename(rel.rstrip("/"))
    manifest = json.load(open(os.path.join(rel, "manifest.json")))
    for name, digest in manifest.get("venv_files", {}).items():
        path = os.path.join(rel, "venv", name)
        if not os.path.isfile(path) or hashlib.sha256(open(path, "rb").read()).hexdigest() != digest:
            out["bad"].append(name)
    for name, digest in (manifest.get("kernel_files") or {}).items():
        path = os.path.join(rel, name)
        if not os.path.isfile(path) or hashlib.sha256(open(path, "rb").read()).hexdigest() != digest:
            out["bad"].append(name)
    for top, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            name = os.path.relpath(os.path.join(top, f), base)
            if not os.path.lexists(os.path.join(rel, "venv", name)):
                out["missing"].append(name)
    out["env_mode"] = oct(os.stat(os.path.join(rel, "service.env")).st_mode & 0o777)
    print(json.dumps(out))
    """)


def release_state(lab: LabHandle, host: str, root: str = "/opt/fleetctl", base: str = "/root/ml-env") -> dict[str, Any]:
    proc = lab.ssh(host, f"/usr/bin/python3 - {root} {base} <<'PY'\n{_CHECK}PY")
    return json.loads(proc.stdout)


def assert_whole(lab: LabHandle, host: str, release_id: str, root: str = "/opt/fleetctl",
                 base: str = "/root/ml-env") -> None:
    """``current`` names ``release_id``, which is whole (manifest hashes, every base file), no temp left."""
    state = release_state(lab, host, root, base)
    assert state["current"] == release_id, state
    assert state["bad"] == [] and state["missing"] == [] and state["temps"] == [], state
    assert state["env_mode"] == "0o600", state


def served_release(lab: LabHandle, host: str, port: int = 30000) -> str:
    out = lab.ssh(host, f"/usr/bin/python3 -c \"import urllib.request as u; print(u.urlopen("
                        f"'http://{lab.addresses[host]}:{port}/server_info', timeout=5).read().decode())\"")
    return str(json.loads(out.stdout)["fleetctl_standin"]["release"])


def write_spec(folder: Path, name: str, body: str, base: str = "/root/ml-env", sglang: bool = True) -> Path:
    """A lab release spec over ``base`` (sglang 0.5.23 unless ``sglang`` is False), served by the stand-in."""
    path = folder / f"{name}.yml"
    requires = 'requires: {sglang: "==0.5.23"}\n' if sglang else ""
    path.write_text(f"name: {name}\nversion: \"1\"\nbase: {{adopt: {base}}}\n{requires}" + textwrap.dedent(body))
    return path
