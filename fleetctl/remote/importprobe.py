"""Import one module in this interpreter and say what happened: the file, its owning distribution,
an attribute's presence, or the error exactly as Python raised it.

Stdlib only, Python >= 3.8. The agent runs it as a child under the venv's python, so the import
sees the venv's packages and cannot hang or pollute the agent itself. An import that fails is an
answer ("imported": false with the error), not a failure of this module.

params:
  module: dotted module name, e.g. "sglang.version"
  attr:   optional dotted attribute inside it, e.g. "SpeculativeAlgorithm.DFLASH"
"""

import importlib
import importlib.machinery
import os
import re
import sys
import sysconfig
import time
import traceback

try:
    from importlib import metadata
except ImportError:  # Python < 3.8
    metadata = None

REPR_MAX = 300
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # differs per process: would keep equal answers apart
TRACEBACK_LINES = 14
BOOTSTRAP_FRAME = "<frozen importlib._bootstrap"  # importlib's own frames say nothing about the failure


def main(params):
    module = params["module"]
    attr = params.get("attr") or None
    answer = {
        "module": module, "attr": attr, "python": sys.executable,
        "python_version": "%d.%d.%d" % tuple(sys.version_info[:3]),
        "imported": False, "duration_ms": None, "file": None,
        "error_type": None, "error": None, "error_name": None, "error_path": None, "traceback": [],
        "attr_found": None, "attr_type": None, "attr_repr": None, "attr_error": None,
    }
    start = time.perf_counter()
    try:
        mod = importlib.import_module(module)
    except BaseException as exc:  # SystemExit or KeyboardInterrupt raised by an import are answers too
        answer["duration_ms"] = round((time.perf_counter() - start) * 1000, 2)
        answer.update(describe_error(exc))
        answer["file"] = locate(module)
    else:
        answer["duration_ms"] = round((time.perf_counter() - start) * 1000, 2)
        answer["imported"] = True
        answer["file"] = module_file(mod)
        if attr:
            answer.update(lookup_attr(mod, module, attr))
    answer["owners"], answer["owners_via"] = owners(module.split(".")[0], answer["file"])
    answer["stdlib"] = in_stdlib(module.split(".")[0], answer["file"])
    return answer


def describe_error(exc):
    """The error as Python put it (an `undefined symbol` message keeps the .so path and symbol)."""
    lines = traceback.format_exception(type(exc), exc, skip_own_frames(exc.__traceback__))
    kept = []
    for chunk in lines:
        if BOOTSTRAP_FRAME in chunk:
            continue
        kept.extend(chunk.rstrip("\n").splitlines())
    return {
        "error_type": type(exc).__name__,
        "error": str(exc),
        "error_name": getattr(exc, "name", None) if isinstance(exc, ImportError) else None,
        "error_path": getattr(exc, "path", None) if isinstance(exc, ImportError) else None,
        "traceback": kept[-TRACEBACK_LINES:],
    }


def skip_own_frames(tb):
    """Start the traceback at the imported code: this module's and importlib's frames say nothing."""
    while tb is not None and tb.tb_next is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (name.startswith("<fleetctl-remote") or name.endswith(os.path.join("importlib", "__init__.py"))):
            break
        tb = tb.tb_next
    return tb


def locate(module):
    """Where the module's file is, found from sys.path without running any package's code."""
    path = None
    spec = None
    for part in module.split("."):
        try:
            spec = importlib.machinery.PathFinder.find_spec(part, path)
        except Exception:
            return None
        if spec is None:
            return None
        path = spec.submodule_search_locations
    if spec is None or not spec.has_location:
        return None
    return spec.origin


def module_file(mod):
    found = getattr(mod, "__file__", None)
    if found:
        return found
    paths = list(getattr(mod, "__path__", None) or [])  # a namespace package has folders, no file
    if paths:
        return paths[0]
    spec = getattr(mod, "__spec__", None)
    return getattr(spec, "origin", None)  # "built-in", "frozen"


def lookup_attr(mod, module, dotted):
    obj = mod
    walked = module
    for part in dotted.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return {"attr_found": False, "attr_error": "%s has no attribute %r" % (walked, part)}
        except Exception as exc:  # a property or __getattr__ that raises: say so, do not crash
            return {"attr_found": False, "attr_error": "%s.%s raised %s: %s" % (walked, part, type(exc).__name__, exc)}
        walked += "." + part
    return {"attr_found": True, "attr_type": type_name(obj), "attr_repr": safe_repr(obj)}


def type_name(obj):
    cls = type(obj)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return "%s.%s" % (cls.__module__, cls.__qualname__)


def safe_repr(obj):
    try:
        text = repr(obj)
    except Exception as exc:
        text = "<repr failed: %s>" % type(exc).__name__
    text = ADDRESS.sub("", text)
    return text if len(text) <= REPR_MAX else text[:REPR_MAX] + "..."


def in_stdlib(top, file):
    """Part of Python itself (no distribution owns those)."""
    if top in sys.builtin_module_names:
        return True
    if not file or not os.path.isabs(file) or "site-packages" in file or "dist-packages" in file:
        return False
    paths = sysconfig.get_paths()
    roots = [os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)]
    real = os.path.realpath(file)
    return any(real.startswith(root + os.sep) for root in roots)


# -- which distribution owns the module ------------------------------------------------------

def owners(top, file):
    """Every installed distribution that provides the top-level name ``top``, the one whose
    RECORD lists ``file`` first. Two *.dist-info folders for one package both show up."""
    if metadata is None:
        return [], "unavailable"
    pd = getattr(metadata, "packages_distributions", None)  # Python >= 3.10
    if pd is not None:
        wanted = set(normalize(n) for n in pd().get(top, ()))
        match = lambda dist: normalize(dist_name(dist)) in wanted  # noqa: E731
        via = "packages_distributions"
    else:
        match = lambda dist: top in top_levels(dist)  # noqa: E731
        via = "scan"
    found = []
    seen = set()
    for dist in metadata.distributions():
        where = str(getattr(dist, "_path", ""))
        if where in seen or not match(dist):
            continue
        seen.add(where)
        found.append({"name": dist_name(dist), "version": dist.version, "metadata_dir": where or None,
                      "owns_file": owns(dist, file)})
    found.sort(key=lambda o: o["owns_file"] is not True)
    return found, via


def owners_by_scan(top):
    """The fallback used when packages_distributions is missing (Python 3.8, 3.9)."""
    return sorted(dist_name(d) for d in metadata.distributions() if top in top_levels(d))


def top_levels(dist):
    """Import names a distribution provides: top_level.txt, else the first parts of RECORD paths."""
    declared = dist.read_text("top_level.txt")
    if declared:
        return set(line.strip() for line in declared.splitlines() if line.strip())
    names = set()
    for f in dist.files or ():
        parts = f.parts
        if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith((".dist-info", ".egg-info")):
            continue
        if len(parts) > 1:
            names.add(parts[0])
        elif parts[0].endswith((".py", ".so", ".pyd")):
            names.add(parts[0].split(".", 1)[0])
    return names


def owns(dist, file):
    """Whether RECORD lists ``file`` (compared relative to the dist's site-packages folder)."""
    if not file or not os.path.isabs(file):
        return None
    base = os.path.realpath(str(dist.locate_file("")))
    rel = os.path.relpath(os.path.realpath(file), base).replace(os.sep, "/")
    return any(str(f).replace(os.sep, "/") == rel for f in dist.files or ())


def dist_name(dist):
    return dist.metadata["Name"] or ""


def normalize(name):
    return name.lower().replace("_", "-").replace(".", "-")
