"""Fused-MoE kernel configs as one venv sees them: its triton version and SGLang's built-in configs.

Stdlib only, Python >= 3.8. Run under the venv's own python (the agent starts it as a child), so
the packages found are the venv's. Nothing is imported: importing triton or sglang takes seconds
and needs a GPU stack; packages are located with ``importlib.util.find_spec`` (which does not run
a top-level package) and read as files.

params:
  op: "inspect" (default) or "collect"
  inspect: contents (bool): also answer the text of every built-in config file
           texts_named (list): else the text of the built-in files of these names only (any folder)
  collect: src (folder): the *.json files directly in it (a tuning run's output), with their text

The triton version is ``__version__`` of the installed ``triton/__init__.py`` (what SGLang's
``triton.__version__`` reads), else the distribution's metadata version.
"""

import importlib.util
import os
import re
import sys

try:
    from importlib import metadata
except ImportError:  # Python < 3.8
    metadata = None

# Where the built-in configs live, newest layout first (0.5.23; 0.5.9 and older).
CONFIG_DIRS = (
    "srt/layers/moe/moe_runner/triton_utils/configs",
    "srt/layers/moe/fused_moe_triton/configs",
)
LOOKUP_FILE = "fused_moe_triton_config.py"  # beside configs/: the code that reads them
TRITON_DISTS = ("triton", "pytorch-triton", "pytorch-triton-rocm", "triton-rocm")
VERSION_RE = re.compile(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", re.M)
# Older SGLang searches a fixed list of triton versions instead of the folders on disk.
FIXED_ORDER_RE = re.compile(r"supported_triton_versions\s*=\s*\[([^\]]*)\]")
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_FILES = 5000


def main(params):
    params = params or {}
    op = params.get("op") or "inspect"
    if op == "inspect":
        return {"schema": 1, "python": sys.executable, "prefix": sys.prefix, "triton": triton_info(),
                "sglang": sglang_info(bool(params.get("contents")), set(params.get("texts_named") or ()))}
    if op == "collect":
        return dict(collect(params["src"]), schema=1, python=sys.executable, triton=triton_info())
    raise ValueError("unknown kernel_configs op %r" % (op,))


def package_dir(name):
    """The folder of an installed top-level package, without importing it; None when absent."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(getattr(spec, "submodule_search_locations", None) or []) if spec else []
    return locations[0] if locations else None


def dist_version(names):
    for name in names:
        try:
            return name, metadata.version(name) if metadata else None
        except Exception:
            continue
    return None, None


def read_text(path, limit=MAX_FILE_BYTES):
    try:
        if os.path.getsize(path) > limit:
            return None
        with open(path, "r", encoding="utf-8") as handle:
            return handle.read()
    except (IOError, OSError, UnicodeDecodeError):
        return None


def triton_info():
    folder = package_dir("triton")
    if folder is None:
        return None
    match = VERSION_RE.search(read_text(os.path.join(folder, "__init__.py")) or "")
    if match:
        return {"version": match.group(1), "path": folder, "source": "triton/__init__.py"}
    dist, version = dist_version(TRITON_DISTS)
    return {"version": version, "path": folder, "source": "metadata of %s" % dist if dist else "unknown"}


def sglang_info(contents, texts_named=frozenset()):
    folder = package_dir("sglang")
    if folder is None:
        return None
    info = {"version": dist_version(("sglang",))[1], "path": folder, "configs_dir": None, "folders": {},
            "files": {}, "fallback_order": None}
    for rel in CONFIG_DIRS:
        configs = os.path.join(folder, rel)
        if os.path.isdir(configs):
            info["configs_dir"] = configs
            info["fallback_order"] = fixed_order(os.path.join(os.path.dirname(configs), LOOKUP_FILE))
            read_folders(configs, info, contents, texts_named)
            break
    return info


def fixed_order(path):
    """The fixed fallback list of an older SGLang (newest first), or None: newest folder on disk first."""
    match = FIXED_ORDER_RE.search(read_text(path) or "")
    if not match:
        return None
    return [v.strip().strip("'\"") for v in match.group(1).split(",") if v.strip()]


def read_folders(configs, info, contents, texts_named=frozenset()):
    """Every ``triton_*`` folder's *.json names (and texts): what SGLANG_MOE_CONFIG_DIR would replace."""
    count = 0
    for folder in sorted(os.listdir(configs)):
        path = os.path.join(configs, folder)
        if not folder.startswith("triton_") or not os.path.isdir(path):
            continue
        names = sorted(n for n in os.listdir(path) if n.endswith(".json") and os.path.isfile(os.path.join(path, n)))
        info["folders"][folder] = names
        for name in names if contents else [n for n in names if n in texts_named]:
            count += 1
            text = read_text(os.path.join(path, name))
            if text is None or count > MAX_FILES:
                raise RuntimeError("cannot read built-in config %s/%s (unreadable, too large or too many)"
                                   % (path, name))
            info["files"]["%s/%s" % (folder, name)] = text


def collect(src):
    """The *.json files directly in ``src`` (SGLang's tuner writes them into its working folder)."""
    if not os.path.isdir(src):
        return {"src": src, "exists": False, "files": {}, "unreadable": []}
    files, unreadable, links = {}, [], []
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if name.endswith(".json") and os.path.islink(path):
            links.append(name)  # never followed: it could point anywhere on the host
            continue
        if not name.endswith(".json") or not os.path.isfile(path):
            continue
        text = read_text(path)
        if text is None:
            unreadable.append(name)
        else:
            files[name] = text
    return {"src": src, "exists": True, "files": files, "unreadable": unreadable, "links": links}
