# Host side of launch-argument validation: parse a release's SGLang arguments with the installed
# SGLang's own parser, in the venv that will serve them. Stdlib only, Python >= 3.8; runs as a child
# under that venv's python (it imports the venv's sglang).
#
# params: parser ("sglang", the default, or "smg": the SGLang Model Gateway's own parser for
#         ``smg launch ARGS``, argv[0] being "launch"; never SGLang's for it),
#         argv (the server's arguments), or argvs ([[instance, argv], ...]: each instance's own
#         arguments, parsed in turn by the one parser; the first refused is answered), overlay ({absolute .py path: source}, optional: patched
#         files read from memory instead of disk, so check mode validates what the release WILL
#         hold without writing it).
# answer: {"validated": true, "ok": bool, "error": "sglang serve: error: ...", "instance": the refused
#          instance (argvs) or None, "checked": how many argv were parsed, "sglang" and "version":
#          the program's version,
#          "parser": "sglang.srt.server_args.ServerArgs.add_cli_args", "seconds": s}
#       | {"validated": false, "why": "..."}   (sglang's parser cannot be imported here)
#
# Only the parser runs (ServerArgs.add_cli_args + parse_args, what prepare_server_args starts
# with): unknown flags, bad choices and bad types are rejected exactly as the server rejects them,
# without the checks that need a GPU or the model's files.
import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import sys
import time


class OverlayLoader(importlib.abc.SourceLoader):
    def __init__(self, path, text):
        self.path = path
        self.text = text

    def get_filename(self, fullname):
        return self.path

    def get_data(self, path):
        if path == self.path:
            return self.text.encode("utf-8")
        with open(path, "rb") as handle:
            return handle.read()

    def path_stats(self, path):  # no bytecode cache for patched text
        raise OSError("overlay")


class OverlayFinder(importlib.abc.MetaPathFinder):
    """Modules whose file is in ``files`` are loaded from that text (patched or added files)."""

    def __init__(self, files):
        self.files = files

    def find_spec(self, fullname, path=None, target=None):
        name = fullname.rpartition(".")[2]
        for entry in (path if path is not None else sys.path):
            for candidate, package in ((os.path.join(entry, name + ".py"), False),
                                       (os.path.join(entry, name, "__init__.py"), True)):
                if candidate in self.files:
                    loader = OverlayLoader(candidate, self.files[candidate])
                    spec = importlib.util.spec_from_file_location(
                        fullname, candidate, loader=loader,
                        submodule_search_locations=[os.path.dirname(candidate)] if package else None)
                    return spec
        return None


def main(params):
    argvs = [[name, [str(a) for a in argv]] for name, argv in params.get("argvs") or []]
    if not argvs:
        argvs = [[None, [str(a) for a in params.get("argv") or []]]]
    overlay = params.get("overlay") or {}
    if overlay:
        sys.meta_path.insert(0, OverlayFinder(overlay))
    if params.get("parser") == "smg":
        return smg_main(argvs)
    start = time.monotonic()
    try:
        from sglang.srt.server_args import ServerArgs
    except BaseException as exc:  # ImportError, or a dependency that fails at import (no torch, ...)
        return {"validated": False, "why": "sglang.srt.server_args cannot be imported in %s: %s: %s"
                % (sys.prefix, type(exc).__name__, str(exc).strip().splitlines()[0][:300] if str(exc) else "")}
    version = ""
    try:
        from importlib import metadata
        version = metadata.version("sglang")
    except Exception:
        pass
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    ok, error, refused, checked = True, "", None, 0
    for name, argv in argvs:  # every instance's own argv: an override may add a flag the base lacks
        checked += 1
        error = parse_error(parser, argv)
        if error is not None:
            ok, refused = False, name
            break
    return {"validated": True, "ok": ok, "error": error or "", "instance": refused, "checked": checked,
            "sglang": version, "version": version, "parser": "sglang.srt.server_args.ServerArgs.add_cli_args",
            "seconds": round(time.monotonic() - start, 2)}


def smg_main(argvs):
    """The gateway's args (``python -m smg launch ARGS``) through smg's own ``parse_router_args``
    (smg/launch_router.py: argparse, then RouterArgs' own checks); nothing is started."""
    start = time.monotonic()
    try:
        from smg.launch_router import parse_router_args
    except BaseException as exc:
        return {"validated": False, "why": "smg.launch_router cannot be imported in %s: %s: %s"
                % (sys.prefix, type(exc).__name__, str(exc).strip().splitlines()[0][:300] if str(exc) else "")}
    version = ""
    try:
        from importlib import metadata
        version = metadata.version("smg")
    except Exception:
        pass
    ok, error, refused, checked = True, "", None, 0
    for name, argv in argvs:
        checked += 1
        if not argv or argv[0] != "launch":
            error = "smg: the args must start with the subcommand launch (python -m smg launch ...)"
        else:
            try:
                error = parse_error(None, argv[1:], parse_router_args)
            except (ValueError, TypeError) as exc:  # RouterArgs' own checks, after argparse's
                error = "%s: %s" % (type(exc).__name__, exc)
            if error is not None and ": error: " in error:  # argparse's prog is this script's name here
                error = "smg launch: error: " + error.split(": error: ", 1)[1]
        if error is not None:
            ok, refused = False, name
            break
    return {"validated": True, "ok": ok, "error": error or "", "instance": refused, "checked": checked,
            "version": version, "parser": "smg.launch_router.parse_router_args",
            "seconds": round(time.monotonic() - start, 2)}


def parse_error(parser, argv, parse=None):
    """The parser's own last line for ``argv`` (``sglang serve: error: ...``), or None when it parses;
    ``parse``: a program's own parse function, in place of ``parser.parse_args``."""
    err = io.StringIO()
    saved, sys.stderr = sys.stderr, err
    try:
        if parse is not None:
            parse(argv)
        else:
            parser.parse_args(argv)
        return None
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return lines[-1] if lines else "rejected"
    finally:
        sys.stderr = saved
