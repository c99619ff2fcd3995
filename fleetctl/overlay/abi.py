"""The overlay's ABI/platform check (pure): may files that work under the source's interpreter be
written into the target's venv?

A distribution's compatibility is what its installer recorded, the WHEEL's ``Tag:`` lines, read
against the tags the *target* interpreter supports (``packaging.tags``, computed here on the
controller from the facts each host reports: implementation, version, SOABI, platform, glibc). A
file's name is never enough on its own: sglang-kernel 0.4.10 is a ``cp310-abi3`` wheel that
carries ``sgl_kernel/*.cpython-310-x86_64-linux-gnu.so``, loaded by path, and runs on any CPython
>= 3.10. A compiled file is checked by name only where the *source* interpreter itself would
import it by that name (its suffix is one of the source's ``EXTENSION_SUFFIXES``): then the
target must import that suffix too (a cp312 venv's ``_yaml.cpython-312-...so`` onto 3.11).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from packaging import tags as ptags

# manylinux's legacy names and the glibc each one means (PEP 600).
_LEGACY = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}


@dataclass(frozen=True)
class Interpreter:
    version: str
    implementation: str
    soabi: str | None
    platform: str  # sysconfig.get_platform(): linux-x86_64
    prefix: str
    site: str
    glibc: str | None = None  # "2.36"; None where the host did not say (an older agent, musl)
    ext_suffixes: tuple[str, ...] = ()  # importlib.machinery.EXTENSION_SUFFIXES

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> Interpreter:
        return cls(raw["version"], raw.get("implementation", "cpython"), raw.get("soabi"), raw["platform"],
                   raw["prefix"], raw["site"], raw.get("glibc"), tuple(raw.get("ext_suffixes") or ()))

    @property
    def minor(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    @property
    def abi_tag(self) -> str:
        """``cpython-311-x86_64-linux-gnu`` -> ``cp311``."""
        found = re.match(r"cpython-(\d+)", self.soabi or "")
        return f"cp{found.group(1)}" if found else f"cp{self.minor[0]}{self.minor[1]}"

    @property
    def machine(self) -> str:
        return self.platform.split("-", 1)[-1].replace("-", "_").replace(".", "_")

    @property
    def suffixes(self) -> frozenset[str]:
        """The extension-module suffixes this interpreter imports (derived where not reported)."""
        if self.ext_suffixes:
            return frozenset(self.ext_suffixes)
        found = {".so"} | ({f".{self.soabi}.so"} if self.soabi else set())
        return frozenset(found | ({".abi3.so"} if self.implementation == "cpython" else set()))

    def where(self) -> str:
        return f"python {self.version} ({self.soabi or self.abi_tag}, {self.platform})"


def platforms(target: Interpreter) -> list[str]:
    """Platform tags the target loads, most specific first: manylinux_2_X down to 2_0 for its glibc
    (with the legacy aliases), then linux_<arch>. Without a glibc fact: any manylinux/musllinux."""
    system, arch = target.platform.split("-", 1)[0], target.machine
    if system != "linux":
        return [target.platform.replace("-", "_").replace(".", "_")]
    found = []
    if target.glibc and re.fullmatch(r"2\.\d+", target.glibc):
        for minor in range(int(target.glibc.split(".")[1]), -1, -1):
            found.append(f"manylinux_2_{minor}_{arch}")
            if (2, minor) in _LEGACY:
                found.append(f"{_LEGACY[(2, minor)]}_{arch}")
    return [*found, f"linux_{arch}"]


@cache
def supported(target: Interpreter) -> frozenset[str]:
    """Every tag (as text) the target interpreter can install, the way pip computes it."""
    version, plats = target.minor, platforms(target)
    if target.implementation == "cpython":
        found: Iterable[ptags.Tag] = [*ptags.cpython_tags(version, [target.abi_tag], plats),
                                      *ptags.compatible_tags(version, target.abi_tag, plats)]
    else:
        interp = f"pp{version[0]}{version[1]}"  # PyPy: SOABI pypy39-pp73-x86_64-linux-gnu -> pypy39_pp73
        abis = ["_".join((target.soabi or "none").split("-")[:2])]
        found = [*ptags.generic_tags(interp, abis, plats),
                 *ptags.compatible_tags(version, interp, plats)]
    return frozenset(str(t) for t in found)


def _loose_platform(plat: str, target: Interpreter) -> bool:
    """Without a glibc fact: any manylinux / musllinux / linux tag for the target's architecture."""
    return target.platform.startswith("linux") and plat.endswith("_" + target.machine) and "linux" in plat


def tag_fits(tag: str, target: Interpreter) -> bool:
    """A WHEEL ``Tag`` (``cp311-cp311-manylinux_2_17_x86_64``, compressed sets allowed) fits."""
    try:
        expanded = ptags.parse_tag(tag)
    except ValueError:
        return True  # not a tag we understand: the extension check still runs
    have = supported(target)
    for t in expanded:
        if str(t) in have:
            return True
        if target.glibc is None and _loose_platform(t.platform, target):
            if str(ptags.Tag(t.interpreter, t.abi, f"linux_{target.machine}")) in have:
                return True
    return False


def extension_reasons(extensions: Iterable[tuple[str, str]], source: Interpreter, target: Interpreter) -> list[str]:
    """Compiled files the source imports by their suffix and the target would not."""
    reasons = []
    for tag, example in extensions:
        suffix = f".{tag}.so" if tag else ".so"
        if suffix in source.suffixes and suffix not in target.suffixes:
            reasons.append(f"{example} is built for {tag} (imported as such by the source's "
                           f"{source.where()}), the target runs {target.where()}")
    return reasons


def compat_reasons(tags: tuple[str, ...], extensions: Iterable[tuple[str, str]], source: Interpreter,
                   target: Interpreter) -> list[str]:
    reasons, extensions = [], list(extensions)
    if tags and not any(tag_fits(t, target) for t in tags):
        compiled = next((example for _, example in extensions), None)
        reasons.append(f"WHEEL tag {', '.join(tags)} does not fit {target.where()}"
                       + (f" (compiled files such as {compiled})" if compiled else ""))
    return reasons + extension_reasons(extensions, source, target)
