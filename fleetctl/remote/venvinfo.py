# Host-side helpers about the running interpreter, shared (through `# fleetctl-include: venvinfo`)
# by the overlay's source and target modules. Stdlib only, Python >= 3.8.
import email.parser
import fnmatch
import os
import re
import sys
import sysconfig


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def wanted(name, patterns):
    """A normalized distribution name against `--packages` globs (every name when there are none)."""
    for pat in patterns:
        if fnmatch.fnmatch(name, pat.lower() if "*" in pat or "?" in pat else normalize(pat)):
            return True
    return not patterns


def glibc():
    """"2.36" where the C library is glibc; None elsewhere (musl) or where it cannot say."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        return None
    parts = found.split()
    return parts[1] if len(parts) == 2 and parts[0] == "glibc" else None


def extension_suffixes():
    import importlib.machinery
    return list(importlib.machinery.EXTENSION_SUFFIXES)


def interpreter():
    return {
        "version": ".".join(str(n) for n in sys.version_info[:3]),
        "implementation": sys.implementation.name,
        "soabi": sysconfig.get_config_var("SOABI"),
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "platform": sysconfig.get_platform(),
        "glibc": glibc(),
        "ext_suffixes": extension_suffixes(),
        "prefix": os.path.normpath(sys.prefix),
        "site": os.path.realpath(sysconfig.get_paths()["purelib"]),
    }


def dist_name(folder, entry):
    """(name, version) of a dist-info folder from its METADATA, else from the folder's own name
    (a half-removed dist-info may have lost its METADATA)."""
    try:
        with open(os.path.join(folder, "METADATA"), "r", encoding="utf-8", errors="replace") as handle:
            msg = email.parser.HeaderParser().parsestr(handle.read())
        if msg.get("Name"):
            return msg.get("Name"), msg.get("Version") or "?"
    except (IOError, OSError):
        pass
    name, _, version = entry[: -len(".dist-info")].partition("-")
    return name, version or "?"
