"""The host side of ``drift --verify-files`` alone, no lab needed: ``remote/distributions.py`` run
the way the agent runs it (a fresh process of the venv's own python) on a local venv holding the
real sglang 0.5.23 wheel's files (7,268 RECORD rows with pip and setuptools), first run (hash cache
removed) vs second run (nothing changed), alternating.

Run: .venv/bin/python bench/drift_host.py [--runs 9] [--module distributions.py] [--baseline distributions.py]
``--baseline`` times another version of the module (e.g. one from ``git show``) in the same loop.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from sglang_support import NEW_SGLANG, wheel  # noqa: E402

WORK = ROOT / ".fleetctl" / "bench-drift-host"
CHILD = r"""
import json, sys, time
started = time.perf_counter()
sys.path.insert(0, sys.argv[1])
import distributions
answer = distributions.main(json.loads(sys.argv[2]))
text = json.dumps(answer)
main_s = time.perf_counter() - started
files = answer["files"]
print(json.dumps({"check_s": files["seconds"], "main_s": main_s, "checked": files["checked"],
                  "hits": files["cache_hits"], "findings": sum(len(files[k]) for k in
                  ("modified", "missing", "orphans", "patched", "foreign_shebangs"))}))
"""


def make_venv(venv: Path) -> None:
    """A venv like the lab's: /usr/bin/python3 -m venv, then the wheel with --no-deps --no-compile."""
    whl = wheel("sglang", NEW_SGLANG)
    marker = venv / ".fleetctl-bench-wheel"
    if marker.exists() and marker.read_text() == whl.name:
        return
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                    "--disable-pip-version-check", str(whl)], check=True)
    marker.write_text(whl.name)


def one_run(venv: Path, module: Path, cache: Path) -> dict[str, float]:
    params = json.dumps({"verify_files": True, "cache_dir": str(cache)})
    start = time.perf_counter()
    proc = subprocess.run([str(venv / "bin/python"), "-c", CHILD, str(module.parent), params],
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    out = json.loads(proc.stdout)
    if out["findings"]:
        raise SystemExit(f"a clean venv reported {out['findings']} findings")
    return dict(out, wall_s=wall)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--module", type=Path, default=ROOT / "fleetctl" / "remote" / "distributions.py")
    ap.add_argument("--baseline", type=Path, help="another distributions.py (e.g. from `git show`), timed in the "
                                                  "same loop, alternating with --module")
    opts = ap.parse_args()
    modules = {"module": opts.module.resolve()}
    if opts.baseline:
        modules["baseline"] = opts.baseline.resolve()
    if any(m.name != "distributions.py" for m in modules.values()):
        raise SystemExit("--module and --baseline must name files called distributions.py")
    venv = WORK / "venv"
    make_venv(venv)
    first: dict[str, list[dict[str, float]]] = {k: [] for k in modules}
    second: dict[str, list[dict[str, float]]] = {k: [] for k in modules}
    for _ in range(opts.runs):  # alternate: cold cache, then warm; each module in turn
        for key, module in modules.items():
            cache = WORK / f"cache-{key}"
            shutil.rmtree(cache, ignore_errors=True)
            first[key].append(one_run(venv, module, cache))
            second[key].append(one_run(venv, module, cache))
    if any(r["hits"] != r["checked"] for rs in second.values() for r in rs):
        raise SystemExit("a second run re-hashed files")
    checked = int(first["module"][0]["checked"])
    command = f".venv/bin/python bench/drift_host.py --runs {opts.runs}" + "".join(
        f" --{k} {v}" for k, v in (("module", opts.module), ("baseline", opts.baseline))
        if v and v != ap.get_default(k))
    lines = [f"# drift --verify-files, host side only ({time.strftime('%Y-%m-%d')}, sglang {NEW_SGLANG} venv, "
             f"{checked} hashed RECORD files, {opts.runs} runs each, alternating)", "", f"Command: `{command}`", "",
             "| module | measure | first run median s | min | second run median s | min | first / second |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for key in modules:
        for measure, name in (("check_s", "file check (the answer's files.seconds)"),
                              ("main_s", "import + main() + JSON answer"),
                              ("wall_s", "whole process (interpreter start to exit)")):
            a, b = [r[measure] for r in first[key]], [r[measure] for r in second[key]]
            ma, mb = statistics.median(a), statistics.median(b)
            lines.append(f"| {key} | {name} | {ma:.3f} | {min(a):.3f} | {mb:.3f} | {min(b):.3f} | {ma / mb:.1f}x |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
