# fleetctl-include: dist_cache
# fleetctl-include: parallel_stat
# fleetctl-include: dist_verify
"""Every distribution installed in one Python environment, and (optionally) whether its files
still match its RECORD. Run by that environment's own interpreter (the agent starts it as a
child), so the site-packages folders are the venv's.

Stdlib only, Python >= 3.8. One call answers everything drift needs from a host.

params:
  verify_files: bool       hash every RECORD file; list missing files and orphans
  cache_dir: str           where the hash cache and the parsed dist-info cache live (default
                           /var/lib/fleetctl/cache; a user
                           who cannot write it keeps its own in ~/.cache/fleetctl/cache)
  release_manifest: str    manifest.json of the release owning this venv (default: ../manifest.json)
  overlays_dir: str        where `fleetctl venv overlay` keeps its manifests (default /var/lib/fleetctl/overlays)
"""

import hashlib
import json
import os
import platform
import re
import sys
import sysconfig
import time

SKIP_DIRS = ("__pycache__",)
NORMALIZE = re.compile(r"[-_.]+")


def normalize(name):
    return NORMALIZE.sub("-", name).lower()


def main(params):
    params = params or {}
    dirs = site_dirs()
    dists = []
    cache_dir = user_cache_dir(params.get("cache_dir") or "/var/lib/fleetctl/cache", "cache")
    parsed = DistCache(cache_dir, os.path.realpath(sys.prefix))
    for site in dirs:
        for entry in sorted(os.listdir(site)) if os.path.isdir(site) else []:
            if entry.endswith(".dist-info") and os.path.isdir(os.path.join(site, entry)):
                dists.append(read_dist_cached(site, entry, parsed))
    answer = {
        "schema": 1,
        "python": sys.executable,
        "prefix": sys.prefix,
        "version": ".".join(str(n) for n in sys.version_info[:3]),
        "cache_tag": sys.implementation.cache_tag,
        "soabi": sysconfig.get_config_var("SOABI"),
        "platform": sysconfig.get_platform(),
        "markers": marker_environment(),
        "site_dirs": dirs,
        "dists": dists,
        "torch_cuda": torch_cuda(dists),
        "files": None,
    }
    mark_overlays(dists, params.get("overlays_dir") or "/var/lib/fleetctl/overlays")
    if params.get("verify_files"):
        answer["files"] = verify(dists, params)
    answer["dist_cache"] = {"ignored": parsed.ignored, "error": parsed.save()}
    for dist in dists:
        for key in [k for k in dist if k.startswith("_")]:
            del dist[key]
    return answer


def mark_overlays(dists, overlays_dir):
    """Name the overlay a distribution came from (`overlay`: source host, venv, time), when this
    venv's origins index says so and the dist-info's RECORD is still the one the overlay wrote."""
    prefix = os.path.normpath(sys.prefix)
    name = "origins-%s.json" % hashlib.sha256(prefix.encode("utf-8")).hexdigest()[:16]
    text = read_text(os.path.join(overlays_dir, name))
    try:
        origins = (json.loads(text) if text else {}).get("dists") or {}
    except ValueError:
        return
    for dist in dists:
        origin = origins.get(dist["name"])
        if not origin or origin.get("dist_info") != dist["dist_info"]:
            continue
        record = os.path.join(dist["site"], dist["dist_info"], "RECORD")
        try:
            with open(record, "rb") as handle:
                same = hashlib.sha256(handle.read()).hexdigest() == origin.get("record_sha256")
        except (IOError, OSError):
            same = False
        if same:
            dist["overlay"] = {k: origin.get(k) for k in ("source_host", "source_venv", "time", "manifest")}


def site_dirs():
    memo = globals().get("AGENT_MEMO")
    paths = memo.get("sysconfig_paths") if memo is not None else None
    if paths is None:  # this interpreter's, fixed for its life: a kept agent asks sysconfig once
        paths = sysconfig.get_paths()
        if memo is not None:
            memo["sysconfig_paths"] = paths
    found = []
    for key in ("purelib", "platlib"):
        path = os.path.realpath(paths[key])
        if path not in found:
            found.append(path)
    return found


def read_text(path):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def parse_metadata(text):
    """Name, Version and Requires-Dist from a METADATA file (RFC 822 headers, as pip reads them)."""
    from email.parser import HeaderParser

    msg = HeaderParser().parsestr(text or "")
    return msg.get("Name"), msg.get("Version"), [r.strip() for r in msg.get_all("Requires-Dist") or []]


def read_dist(site, entry):
    folder = os.path.join(site, entry)
    name, version, requires = parse_metadata(read_text(os.path.join(folder, "METADATA")))
    if name is None:  # a dist-info without METADATA: keep what its folder name says
        stem = entry[: -len(".dist-info")]
        name, _, version = stem.partition("-")
    record, record_sha256 = read_record(os.path.join(folder, "RECORD"))
    direct = read_text(os.path.join(folder, "direct_url.json"))
    installer = (read_text(os.path.join(folder, "INSTALLER")) or "").strip() or None
    return {
        "name": normalize(name),
        "display_name": name,
        "version": version,
        "dist_info": entry,
        "site": site,
        "installer": installer,
        "direct_url": describe_direct_url(direct),
        "requires": requires,
        "top_level": top_level(folder, record),
        "record_files": len(record),
        "_record": record,
        "_record_path": os.path.join(folder, "RECORD"),
        "_record_sha256": record_sha256,
    }


def read_record(path):
    """(RECORD rows, sha256 of its text). A kept agent (AGENT_MEMO) answers the next command's
    audit from memory while the file's identity is unchanged: parsing a big RECORD is most of a
    version-only audit's host time."""
    memo = globals().get("AGENT_MEMO")
    ident = None
    if memo is not None:
        try:
            st = os.stat(path)
            ident = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
        except OSError:
            ident = None
        known = memo.get(("record", path))
        if ident is not None and known is not None and known[0] == ident:
            return known[1]
    text = read_text(path)
    value = (tuple(parse_record(text)), hashlib.sha256((text or "").encode("utf-8")).hexdigest())
    if ident is not None:
        memo[("record", path)] = (ident, value)  # one entry per RECORD path: bounded
    return value


def describe_direct_url(text):
    """PEP 610: editable / vcs / local path / url, or None for an index install."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return {"kind": "invalid", "url": None}
    url = data.get("url")
    if data.get("dir_info", {}).get("editable"):
        return {"kind": "editable", "url": url}
    if "vcs_info" in data:
        vcs = data["vcs_info"]
        return {"kind": "vcs", "url": url, "vcs": vcs.get("vcs"), "commit": vcs.get("commit_id")}
    if "dir_info" in data:
        return {"kind": "local", "url": url}
    return {"kind": "url", "url": url}


def parse_record(text):
    """RECORD rows as (path relative to site, 'algo=digest' or '', size or None)."""
    lines = (text or "").splitlines()
    rows = []
    for row in split_record_lines(lines):
        if not row or not row[0]:
            continue
        n = len(row)
        size = row[2] if n > 2 else ""
        rows.append((row[0], row[1] if n > 1 else "", int(size) if size.isdigit() else None))
    return rows


def split_record_lines(lines):
    """What csv.reader(lines) gives, faster: a line without a quote is what str.split(",") makes
    of it, a quoted one goes through csv alone, unless a quoted field runs on past its line (then
    the whole text goes through csv, as a field may hold a line break)."""
    import csv

    out = []
    for line in lines:
        if '"' not in line:
            out.append(line.split(","))
            continue
        row = next(csv.reader([line + "\n"]), [])
        if any("\n" in field for field in row):  # the line ended inside quotes
            return list(csv.reader(lines))
        out.append(row)
    return out


def top_level(folder, record):
    text = read_text(os.path.join(folder, "top_level.txt"))
    if text:
        return sorted(set(n.strip() for n in text.split() if n.strip()))
    names = set()
    for path, _digest, _size in record:
        first = path.split("/", 1)[0]
        if first.endswith((".dist-info", ".data")) or first in ("..", "") or first == "__pycache__":
            continue
        names.add(first[:-3] if first.endswith(".py") else first)
    return sorted(names)


def marker_environment():
    """PEP 508 marker variables of this interpreter (what packaging.markers.default_environment gives)."""
    impl = sys.implementation
    iver = "%d.%d.%d" % impl.version[:3]
    if impl.version.releaselevel != "final":
        iver += impl.version.releaselevel[0] + str(impl.version.serial)
    return {
        "implementation_name": impl.name,
        "implementation_version": iver,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def torch_cuda(dists):
    """torch's CUDA build from torch/version.py (dist metadata often lacks the +cuXYZ suffix)."""
    for dist in dists:
        if dist["name"] == "torch":
            text = read_text(os.path.join(dist["site"], "torch", "version.py")) or ""
            found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]*)['\"]", text, re.M)
            return found.group(1) if found else None
    return None
