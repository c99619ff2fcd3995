"""Launch args are checked by the parser of the program the service runs: SGLang's for SGLang's
server, the gateway's own for ``smg`` (the host-side script run under the real smg 1.13.0 venv that
``make deps`` installs), and none for a program fleetctl knows no parser for, said so."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from gateway_support import SMG

from fleetctl.release.launch_check import parser_for

SCRIPT = Path(__file__).resolve().parent.parent / "fleetctl" / "remote" / "launch_args.py"


def smg_check(*argvs: list[str]) -> dict[str, object]:
    """remote/launch_args.py's answer, run by the smg venv's python as on a host."""
    assert SMG.exists(), f"{SMG} is missing: run make deps (it installs smg 1.13.0 from PyPI)"
    code = (f"import json, sys; sys.path.insert(0, {str(SCRIPT.parent)!r}); import launch_args; "
            "print(json.dumps(launch_args.main(json.load(sys.stdin))))")
    params = {"parser": "smg", "argvs": [[None, a] for a in argvs]}
    out = subprocess.run([str(SMG.parent / "python"), "-c", code], input=json.dumps(params), capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_each_program_has_its_own_parser() -> None:
    assert parser_for("sglang.launch_server") == "sglang"
    assert parser_for("smg") == "smg"
    assert parser_for("vllm.entrypoints.openai.api_server") is None


def test_smg_launch_args_by_smg_itself() -> None:
    good = smg_check(["launch", "--policy", "cache_aware", "--worker-urls", "http://10.0.0.1:30000",
                      "--host", "10.0.0.9", "--port", "30080"])
    assert (good["validated"], good["ok"], good["version"], good["parser"]) == (
        True, True, "1.13.0", "smg.launch_router.parse_router_args")
    bad = smg_check(["launch", "--policy", "fastest"])
    assert bad["ok"] is False
    assert str(bad["error"]).startswith("smg launch: error: argument --policy: invalid choice: 'fastest'")
    # an SGLang flag is not the gateway's
    assert smg_check(["launch", "--tp", "8"])["error"] == "smg launch: error: unrecognized arguments: --tp 8"
    assert smg_check(["serve"])["error"] == \
        "smg: the args must start with the subcommand launch (python -m smg launch ...)"
