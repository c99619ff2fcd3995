"""Which tuned fused-MoE Triton kernel configs the installed SGLang has for one GPU model.

fleetctl probe script example; run it with the venv's python (the default) so it sees the venv's
sglang. Nothing is imported: the package is located and its config folder listed.

Arguments (--arg key=value):
  device  GPU name as SGLang writes it, spaces as underscores (e.g. NVIDIA_H200); default: all
  E       only configs for this number of experts (optional)

Looks where SGLang does: $SGLANG_MOE_CONFIG_DIR/configs/ when set (it replaces the built-in
folder), else sglang/srt/layers/moe/moe_runner/triton_utils/configs/ (older releases:
sglang/srt/layers/moe/fused_moe_triton/configs/), one triton_X_Y_Z folder per Triton version.
Prints one JSON document; exits 1 when sglang is not installed. Stdlib only, Python >= 3.8.
"""

import importlib.util
import json
import os
import re
import sys

try:
    from importlib import metadata
except ImportError:  # Python < 3.8
    metadata = None

LAYOUTS = ("srt/layers/moe/moe_runner/triton_utils/configs", "srt/layers/moe/fused_moe_triton/configs")
args = json.loads(os.environ.get("FLEETCTL_ARGS") or "{}")
device = args.get("device")
experts = args.get("E")


def version_of(dist):
    try:
        return metadata.version(dist) if metadata else None
    except Exception:
        return None


def config_root():
    """(folder, where it came from) of the triton_* folders SGLang reads."""
    override = os.environ.get("SGLANG_MOE_CONFIG_DIR")
    if override:
        return os.path.join(override, "configs"), "SGLANG_MOE_CONFIG_DIR"
    spec = importlib.util.find_spec("sglang")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"moe_configs: sglang is not installed for {sys.executable}")
    package = list(spec.submodule_search_locations)[0]
    for layout in LAYOUTS:
        if os.path.isdir(os.path.join(package, layout)):
            return os.path.join(package, layout), "sglang/" + layout
    return None, f"no config folder in {package}"


def wanted(name):
    if not name.endswith(".json") or not name.startswith("E="):
        return False
    if device and f",device_name={device}" not in name:
        return False
    return not experts or name.startswith(f"E={experts},")


def version_key(folder):
    return tuple(int(n) for n in re.findall(r"\d+", folder))


root, source = config_root()
triton = version_of("triton")
folders = {}
if root and os.path.isdir(root):
    for sub in sorted((d for d in os.listdir(root) if d.startswith("triton_")), key=version_key):
        names = sorted(n for n in os.listdir(os.path.join(root, sub)) if wanted(n))
        if names:
            folders[sub] = names
exact = "triton_" + triton.split("+")[0].replace(".", "_") if triton else None
used = None if not triton else (exact if exact in folders else (max(folders, key=version_key) if folders else None))
print(json.dumps({
    "sglang": version_of("sglang"),
    "device": device or "(all)",
    "source": source,
    "root": root,
    "triton": triton,
    "folder_used": used,  # what SGLang would read for this Triton (newest other one as fallback)
    "exact_match": bool(exact and exact in folders),
    "count": sum(len(v) for v in folders.values()),
    "folders": folders,
}))
