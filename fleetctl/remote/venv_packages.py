"""The ML stack of one Python environment, read by that environment's own interpreter.

Stdlib only, Python >= 3.8. Run under a venv's python (the agent starts it as a child) so that
``sys.path`` is the venv's. Versions come from ``importlib.metadata``: nothing is imported, since
importing torch takes seconds and a broken sgl-kernel can crash the process.

params (all optional):
  packages: extra distribution names to report besides the ML stack
"""

import re
import sys
import sysconfig

try:
    from importlib import metadata
except ImportError:  # Python < 3.8 has no importlib.metadata: report that, do not crash
    metadata = None

# Report key -> distribution names to try, in order. sgl-kernel was renamed sglang-kernel (the
# import name stays sgl_kernel), and flashinfer ships as flashinfer-python on PyPI.
STACK = (
    ("torch", ("torch",)),
    ("triton", ("triton",)),
    ("sglang", ("sglang",)),
    ("sgl-kernel", ("sgl-kernel",)),
    ("sglang-kernel", ("sglang-kernel",)),
    ("flashinfer", ("flashinfer-python", "flashinfer")),
    ("transformers", ("transformers",)),
)
CUDA_SUFFIX = re.compile(r"\+cu(\d+)(\d)$")
VERSION_PY_FIELD = r"^%s\s*(?::[^=]*)?=\s*(?:['\"]([^'\"]*)['\"]|None)"


def main(params):
    params = params or {}
    answer = {
        "schema": 1,
        "executable": sys.executable,
        "version": ".".join(str(n) for n in sys.version_info[:3]),
        "full_version": sys.version,
        "prefix": sys.prefix,
        "base_prefix": getattr(sys, "base_prefix", sys.prefix),
        "in_venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
        "implementation": sys.implementation.name,
        "cache_tag": sys.implementation.cache_tag,
        "soabi": sysconfig.get_config_var("SOABI"),
        "packages": {},
        "dists": {},
        "duplicates": {},
        "torch": None,
        "error": None,
    }
    if metadata is None:
        answer["error"] = f"importlib.metadata not available on Python {answer['version']}"
        return answer
    index = index_distributions()
    wanted = list(STACK) + [(name, (name,)) for name in params.get("packages") or ()]
    for key, candidates in wanted:
        dist_name, dists = first_found(index, candidates)
        answer["packages"][key] = dists[0].version if dists else None
        if dists:
            answer["dists"][key] = {"name": dist_name, "location": location(dists[0])}
        if len(dists) > 1:  # two dist-info folders for one package: an overlay left a stale one
            answer["duplicates"][key] = [d.version for d in dists]
    torch_dists = first_found(index, ("torch",))[1]
    if torch_dists:
        answer["torch"] = torch_build(torch_dists[0])
    return answer


def canonical(name):
    """PEP 503 name normalisation: Sgl_Kernel, sgl.kernel and sgl-kernel are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def index_distributions():
    """canonical name -> distributions in sys.path order (the first is what ``import`` finds)."""
    # Skip '' (the current directory): a stray *.dist-info there is not part of the venv.
    path = [p for p in sys.path if p]
    index = {}
    for dist in metadata.distributions(path=path):
        try:
            name = dist.metadata["Name"]
        except Exception:  # a corrupt METADATA file must not hide the other packages
            continue
        if name:
            index.setdefault(canonical(name), []).append(dist)
    return index


def first_found(index, candidates):
    for name in candidates:
        dists = index.get(canonical(name))
        if dists:
            return name, dists
    return None, []


def location(dist):
    try:
        return str(dist.locate_file(""))
    except Exception:
        return None


def torch_build(dist):
    """CUDA (or ROCm) version torch was built for, without importing torch."""
    version = dist.version
    m = CUDA_SUFFIX.search(version)
    if m:  # 2.9.1+cu128 -> 12.8
        return {"version": version, "cuda": f"{m.group(1)}.{m.group(2)}", "hip": None,
                "source": "version suffix"}
    text = read_dist_file(dist, "torch/version.py")
    if text is None:
        return {"version": version, "cuda": None, "hip": None, "source": None}
    return {
        "version": version,
        "cuda": version_py_field(text, "cuda"),
        "hip": version_py_field(text, "hip"),
        "source": "torch/version.py",
    }


def read_dist_file(dist, relpath):
    try:
        for f in dist.files or ():
            if str(f).replace("\\", "/") == relpath:
                return f.read_text()
        target = dist.locate_file(relpath)  # no RECORD: look where the file should be
        with open(str(target), encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def version_py_field(text, field):
    """``cuda = '12.8'`` or ``cuda: Optional[str] = '12.8'``; None for ``= None`` (CPU build)."""
    m = re.search(VERSION_PY_FIELD % re.escape(field), text, re.MULTILINE)
    if m is None:
        return None
    return m.group(1) or None
