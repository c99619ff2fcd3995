# Host-side helpers about the running interpreter, shared (through `# fleetctl-include: venvinfo`)
# by the overlay's source and target modules. Stdlib only, Python >= 3.8.
import os
import re
import sys
import sysconfig


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def interpreter():
    return {
        "version": ".".join(str(n) for n in sys.version_info[:3]),
        "implementation": sys.implementation.name,
        "soabi": sysconfig.get_config_var("SOABI"),
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "platform": sysconfig.get_platform(),
        "prefix": os.path.normpath(sys.prefix),
        "site": os.path.realpath(sysconfig.get_paths()["purelib"]),
    }
