"""Tuned fused-MoE configs without a lab: SGLang's names (every name in the sglang 0.5.23 wheel),
validation (bad JSON, wrong keys), SGLang's lookup and fallback, selection and the merge per host,
collect, the release step on a scripted session, the host-side module, and the CLI on a local host."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cli_support import CliRun, run_cli

from fleetctl import kernels as k
from fleetctl.errors import InputError
from fleetctl.gpu.smi import parse_gpu_facts
from fleetctl.release.kernels import KernelsRefused, release_kernels
from fleetctl.release.spec import load_spec

FIXTURES = Path(__file__).parent / "fixtures"
KFIX = FIXTURES / "kernels"
TUNED = KFIX / "tuned"
REAL_NAMES = (KFIX / "sglang-0.5.23-config-names.txt").read_text().split("\n")[:-1]
REAL_NAMES_059 = (KFIX / "sglang-0.5.9-config-names.txt").read_text().split("\n")[:-1]
REMOTE = Path(__file__).resolve().parents[1] / "fleetctl" / "remote" / "kernel_configs.py"
H200 = "E=256,N=256,device_name=NVIDIA_H200.json"
H200_FP8 = "E=128,N=192,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
H200_DOWN = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json"
GOOD = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
              "num_stages": 3}}


def builtin_0523(names: list[str] = REAL_NAMES) -> dict[str, list[str]]:
    """The built-in triton folders of sglang 0.5.23 (or of ``names``), as the host-side module reports them."""
    out: dict[str, list[str]] = {}
    for rel in names:
        folder, name = rel.split("/")
        out.setdefault(folder, []).append(name)
    return out


def host(triton: str | None = "3.4.0", gpu: str | None = "NVIDIA H200", **kw: Any) -> k.KernelHost:
    facts = k.KernelHost("/root/ml-env", [gpu] if gpu else [], "test", triton, "test", "0.5.23", "/cfg",
                         builtin_0523())
    for key, value in kw.items():
        setattr(facts, key, value)
    return facts


# --- names ------------------------------------------------------------------------------------------

def test_every_config_name_in_the_sglang_wheel_parses_and_round_trips() -> None:
    assert len(REAL_NAMES) == 390
    for rel in REAL_NAMES:
        name = rel.split("/")[1]
        assert k.parse_config_name(name).filename() == name


@pytest.mark.parametrize(("filename", "parts"), [
    ("E=512,N=128,device_name=NVIDIA_H200.json", (512, 128, "NVIDIA_H200", None, None, False, False)),
    ("E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json",
     (257, 256, "NVIDIA_H200", "fp8_w8a8", (128, 128), False, True)),
    ("E=161,N=192,device_name=NVIDIA_H200,dtype=fp8_w8a8,per_channel_quant=True.json",
     (161, 192, "NVIDIA_H200", "fp8_w8a8", None, True, False)),
    ("E=256,N=512,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition_down.json",
     (256, 512, "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition", None, None, False, True)),
    ("E=128,N=704,device_name=NVIDIA_H200_NVL.json", (128, 704, "NVIDIA_H200_NVL", None, None, False, False)),
    ("E=384,N=128,device_name=,dtype=int4_w4a16_down.json", (384, 128, "", "int4_w4a16", None, False, True)),
])
def test_config_name_parts(filename: str, parts: tuple[Any, ...]) -> None:
    assert k.parse_config_name(filename) == k.ConfigName(*parts)


@pytest.mark.parametrize("filename", [
    "E=8,N=14336,device_name=NVIDIA_H200,block_shape=[128,128].json",  # SGLang writes "[128, 128]"
    "E=8,N=14336,device_name=NVIDIA_H200,block_shape=[128, 128],dtype=fp8_w8a8.json",  # wrong order
    "E=8,N=14336,device_name=NVIDIA_H200,per_channel_quant=False.json",  # SGLang leaves it out instead
    "N=14336,E=8,device_name=NVIDIA_H200.json",
    "E=8,N=14336,device_name=NVIDIA H200.json",  # spaces become underscores
    "E=8,N=14336,device_name=NVIDIA_H200.JSON",
    "config.json",
])
def test_names_sglang_would_never_ask_for_are_refused(filename: str) -> None:
    with pytest.raises(k.KernelConfigError, match="not an SGLang fused-MoE config name"):
        k.parse_config_name(filename, f"dir/{filename}")


def test_triton_folders() -> None:
    assert k.triton_folder("3.4.0") == "triton_3_4_0"
    assert k.triton_folder("3.4.0+git1234") == "triton_3_4_0+git1234"  # as SGLang: never an exact match
    assert sorted(["triton_3_10_0", "triton_3_9_1", "triton_3_4_0"], key=k.folder_version) == [
        "triton_3_4_0", "triton_3_9_1", "triton_3_10_0"]


# --- validation -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("case", "message"), [
    ("bad-json", "E=256,N=256,device_name=NVIDIA_H200.json: not valid JSON: Expecting property name enclosed "
                 "in double quotes: line 4 column 1"),
    ("wrong-key", "E=256,N=256,device_name=NVIDIA_H200.json: key '64': missing GROUP_SIZE_M"),
    ("missing-key", "E=256,N=256,device_name=NVIDIA_H200.json: key '8': missing GROUP_SIZE_M"),
    ("batch-key", "E=256,N=256,device_name=NVIDIA_H200.json: key 'bs=1': not a batch size"),
    ("misplaced", "E=256,N=256,device_name=NVIDIA_H200.json: tuned configs go in"),
    ("bad-folder", "E=256,N=256,device_name=NVIDIA_H200.json: tuned configs go in"),
    ("bad-name", "block_shape=[128,128].json: not an SGLang fused-MoE config name"),
])
def test_bad_fixture_folders_fail_with_one_line_naming_file_and_key(case: str, message: str) -> None:
    with pytest.raises(k.KernelConfigError) as err:
        k.load_tuned(KFIX / "bad" / case)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(str(KFIX / "bad" / case)) and message in text, text


@pytest.mark.parametrize(("entry", "message"), [
    ({**GOOD["1"], "BLOCK_SIZE_m": 16}, "key '1': unknown parameter 'BLOCK_SIZE_m'"),
    ({**GOOD["1"], "num_warps": "4"}, "key '1': num_warps is '4', expected a positive integer"),
    ({**GOOD["1"], "num_stages": 0}, "key '1': num_stages is 0, expected a positive integer"),
    ({**GOOD["1"], "num_warps": True}, "key '1': num_warps is True, expected a positive integer"),
    ({**GOOD["1"], "USE_TMA": 1}, "key '1': USE_TMA is 1, expected true or false"),
    ([16, 64], "key '1': expected an object of kernel parameters"),
])
def test_wrong_keys_and_values(entry: Any, message: str) -> None:
    with pytest.raises(k.KernelConfigError, match=f"^f.json: {message}"):
        k.validate_config(json.dumps({"1": entry}), "f.json")


def test_sglang_optional_keys_are_accepted() -> None:
    rocm = {**GOOD["1"], "waves_per_eu": 0, "kpack": 2, "matrix_instr_nonkdim": 16, "USE_TMA": True, "num_ctas": 1}
    assert k.validate_config(json.dumps({"1": rocm}), "f.json")["1"]["waves_per_eu"] == 0
    with pytest.raises(k.KernelConfigError, match="expected a non-empty object of batch sizes"):
        k.validate_config("[]", "f.json")


def test_load_tuned_fixture_set() -> None:
    tuned = k.load_tuned(TUNED)
    assert [f.rel for f in tuned.files] == [
        f"triton_3_4_0/{H200_FP8}", f"triton_3_4_0/{H200}", f"triton_3_6_0/{H200_DOWN}", f"triton_3_6_0/{H200}",
        "triton_3_6_0/E=256,N=512,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json"]
    assert [f.rel for f in tuned.for_devices(["NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"])] == [
        "triton_3_6_0/E=256,N=512,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json"]
    assert tuned.readme is None


def test_repo_samples_are_valid_and_labelled() -> None:
    tuned = k.load_tuned(Path(__file__).resolve().parents[1] / "playbooks" / "files" / "kernels")
    assert tuned.readme and tuned.readme.startswith("SAMPLE")
    assert {f.name.device_name for f in tuned.files} == {"NVIDIA_H200", "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"}


# --- SGLang's lookup, selection, plan, merge --------------------------------------------------------

def test_sglang_lookup_exact_then_newest_other_folder_then_fixed_list() -> None:
    folders = {"triton_3_1_0": {"a.json", "b.json"}, "triton_3_4_0": {"a.json"}, "triton_3_10_0": {"b.json"}}
    assert k.sglang_lookup("a.json", "3.4.0", folders) == "triton_3_4_0"
    assert k.sglang_lookup("a.json", "3.5.1", folders) == "triton_3_4_0"
    assert k.sglang_lookup("b.json", "3.5.1", folders) == "triton_3_10_0"  # numeric, not string, order
    assert k.sglang_lookup("c.json", "3.5.1", folders) is None
    # sglang 0.5.9 tries a fixed list: a folder not on it is never read
    assert k.sglang_lookup("b.json", "3.5.1", folders, ["3.4.0", "3.3.1", "3.2.0", "3.1.0"]) == "triton_3_1_0"


def test_plan_exact_and_fallback_per_file() -> None:
    plan = k.plan_host("gpu01", host("3.4.0"), k.load_tuned(TUNED))
    assert [(e.filename, e.tuned_in, e.loads, e.status) for e in plan.entries] == [
        (H200_FP8, ["triton_3_4_0"], "triton_3_4_0", "exact"),
        (H200_DOWN, ["triton_3_6_0"], "triton_3_6_0", "fallback"),
        (H200, ["triton_3_4_0", "triton_3_6_0"], "triton_3_4_0", "exact")]
    assert plan.warnings == [f"{H200_DOWN}: not in triton_3_4_0 (the host's triton 3.4.0): SGLang falls back to "
                             "triton_3_6_0, performance might be sub-optimal"]
    assert "NVIDIA_RTX" not in " ".join(plan.selected)


def test_plan_built_in_file_of_the_exact_folder_shadows_a_tuned_one() -> None:
    facts = host("3.5.1", builtin={"triton_3_5_1": [H200]})
    plan = k.plan_host("gpu01", facts, k.load_tuned(TUNED))
    entry = next(e for e in plan.entries if e.filename == H200)
    assert (entry.loads, entry.status) == ("triton_3_5_1", "shadowed")
    assert f"{H200}: tuned in triton_3_4_0, triton_3_6_0 but SGLang loads the built-in triton_3_5_1" in (
        " ".join(plan.warnings))


def test_plan_warns_when_no_folder_for_the_hosts_triton_exists_at_all() -> None:
    plan = k.plan_host("gpu01", host("3.9.0"), k.load_tuned(TUNED))
    assert plan.warnings[0].startswith("no triton_3_9_0 folder at all (built-in or tuned): SGLang falls back to "
                                       "the newest other triton folder holding each config (triton_3_8_0, ")
    assert {e.status for e in plan.entries} == {"fallback"}


def test_plan_old_sglang_never_reads_a_folder_off_its_list() -> None:
    facts = host("3.5.1", sglang_version="0.5.9", fixed_order=["3.4.0", "3.3.1", "3.2.0", "3.1.0"])
    plan = k.plan_host("old", facts, k.load_tuned(TUNED))
    down = next(e for e in plan.entries if e.filename == H200_DOWN)
    assert (down.loads, down.status) == (None, "unused")


def test_plan_without_tuned_file_for_the_gpu_or_without_gpu_and_triton() -> None:
    plan = k.plan_host("a100", host("3.4.0", gpu="NVIDIA A100-SXM4-80GB"), k.load_tuned(TUNED))
    assert plan.entries == [] and plan.warnings == [
        f"no tuned config for NVIDIA_A100-SXM4-80GB in {TUNED}: SGLang uses its built-in one if any, else its "
        "default config (sub-optimal)"]
    blind = host(None, gpu=None, gpu_source="nvidia-smi not found", triton_source="triton not installed in /v",
                 builtin_dir=None, builtin={})
    plan = k.plan_host("lab", blind, k.load_tuned(TUNED))
    assert plan.warnings == ["no GPU name (nvidia-smi not found): set the host var gpu_name; no tuned config selected",
                             "no triton version (triton not installed in /v): set the host var triton_version"]
    assert plan.notes[0].startswith("sglang not found in /root/ml-env")


def test_merge_keeps_every_built_in_file_and_tuned_win_on_a_clash() -> None:
    tuned = k.load_tuned(TUNED).for_devices(["NVIDIA_H200"])
    builtin = {f"triton_3_4_0/{H200_FP8}": "{builtin}", "triton_3_1_0/E=8,N=7168,device_name=NVIDIA_H200.json": "{}"}
    files, replaced = k.merged_folder(builtin, tuned)
    assert replaced == [f"triton_3_4_0/{H200_FP8}"]
    assert files[f"triton_3_4_0/{H200_FP8}"] == (TUNED / "triton_3_4_0" / H200_FP8).read_text()
    assert files["triton_3_1_0/E=8,N=7168,device_name=NVIDIA_H200.json"] == "{}"
    assert len(files) == 2 + 3


def test_gpu_and_triton_from_facts_with_host_vars_standing_in() -> None:
    xml = (FIXTURES / "nvidia-smi" / "h200-xml" / "nvidia-smi-q-x.xml").read_text()
    h200 = parse_gpu_facts({"path": "/usr/bin/nvidia-smi", "xml": {"rc": 0, "stdout": xml, "stderr": ""}})
    assert k.resolve_gpu(h200, {}) == (["NVIDIA H200"], "nvidia-smi")
    assert k.resolve_gpu(h200, {"gpu_name": "NVIDIA B200"}) == (
        ["NVIDIA H200"], "nvidia-smi; host var gpu_name='NVIDIA B200' ignored")
    assert k.resolve_gpu(parse_gpu_facts(None), {"gpu_name": "NVIDIA H200"}) == (
        ["NVIDIA H200"], "host var gpu_name: nvidia-smi not found")
    assert k.resolve_gpu(parse_gpu_facts(None), {}) == ([], "nvidia-smi not found")
    assert k.resolve_triton({"version": "3.6.0"}, {}, "/v") == ("3.6.0", "/v")
    assert k.resolve_triton(None, {"triton_version": "3.4.0"}, "/v") == (
        "3.4.0", "host var triton_version: triton not installed in /v")
    assert k.resolve_triton(None, {}, "/v") == (None, "triton not installed in /v")


# --- collect ----------------------------------------------------------------------------------------

def collected(files: dict[str, str], triton: str | None = "3.6.0") -> k.Collected:
    return k.Collected("gpu01", "/root/tune", triton, "/v", ["NVIDIA H200"], "nvidia-smi", True, files)


def test_collect_adds_keeps_and_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    text = json.dumps(GOOD)
    (tmp_path / "triton_3_6_0").mkdir()
    (tmp_path / "triton_3_6_0" / H200).write_text(text)
    (tmp_path / "triton_3_6_0" / H200_FP8).write_text("{}")
    got = collected({H200: text, H200_FP8: text, "E=8,N=64,device_name=NVIDIA_B200.json": text})
    items = k.plan_collect(got, tmp_path, force=False)
    assert [(i.filename, i.target, i.action) for i in items] == [
        (H200_FP8, f"triton_3_6_0/{H200_FP8}", "differs"), (H200, f"triton_3_6_0/{H200}", "unchanged"),
        ("E=8,N=64,device_name=NVIDIA_B200.json", "triton_3_6_0/E=8,N=64,device_name=NVIDIA_B200.json", "added")]
    assert items[2].note == "tuned for NVIDIA_B200, gpu01 has NVIDIA_H200"
    forced = k.plan_collect(got, tmp_path, force=True)
    assert forced[0].action == "overwritten"
    k.write_collected(got, forced, tmp_path)
    assert (tmp_path / "triton_3_6_0" / H200_FP8).read_text() == text


def test_collect_validates_every_file_and_needs_a_triton_version(tmp_path: Path) -> None:
    with pytest.raises(k.KernelConfigError, match=r"^gpu01:/root/tune/E=256.*: key '1': missing GROUP_SIZE_M$"):
        k.plan_collect(collected({H200: json.dumps({"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64,
                                                           "num_warps": 4}})}), tmp_path, False)
    # no num_warps/num_stages: SGLang loads such a config (it ships some itself), so a warning, not a refusal
    short = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}}
    (item,) = k.plan_collect(collected({H200: json.dumps(short)}), tmp_path, False)
    assert item.action == "added" and item.note == ("batch size 1 has no num_warps/num_stages: SGLang loads it "
                                                    "with Triton's defaults (as some of its own configs)")
    with pytest.raises(InputError, match="set the host var triton_version"):
        k.plan_collect(collected({H200: json.dumps(GOOD)}, triton=None), tmp_path, False)
    assert not any(tmp_path.iterdir())


# --- the release step on a scripted session ---------------------------------------------------------

class ScriptedSession:
    """Answers ``facts`` and ``kernel_configs`` as a lab host would (no GPU, no triton)."""

    def __init__(self, host_vars: dict[str, Any], builtin: dict[str, str]) -> None:
        self.name = "lab1"
        self.vars = host_vars
        self.builtin = builtin
        self.calls: list[tuple[str, Any, str | None]] = []

    def call(self, op: str, params: dict[str, Any] | None = None, *, python: str | None = None,
             timeout: float | None = None) -> Any:
        self.calls.append((op, params, python))
        if op == "facts":
            return {"schema": 1, "nvidia_smi": {"path": None}}
        folders: dict[str, list[str]] = {}
        for rel in self.builtin:
            folders.setdefault(rel.split("/")[0], []).append(rel.split("/")[1])
        return {"python": "/root/ml-env/bin/python", "triton": None,
                "sglang": {"version": "0.5.23", "configs_dir": "/cfg", "folders": folders, "files": self.builtin}}


def kernel_spec(tmp_path: Path) -> Path:
    shutil.copytree(TUNED, tmp_path / "tuned")
    spec = tmp_path / "kernels-unit.yml"
    spec.write_text(textwrap.dedent("""\
        name: kernels-unit
        version: "1"
        base: {adopt: /root/ml-env}
        kernels: {dir: tuned}
        """))
    return spec


def test_release_step_merges_built_in_and_tuned_and_names_the_folder(tmp_path: Path) -> None:
    spec = load_spec(kernel_spec(tmp_path))
    builtin = {f"triton_3_4_0/{H200_FP8}": "{}", "triton_3_1_0/E=8,N=7168,device_name=NVIDIA_H200.json": "{}"}
    session = ScriptedSession({"gpu_name": "NVIDIA H200", "triton_version": "3.4.0", "fleetctl_root": "/srv/fc"},
                              builtin)
    out = release_kernels(session, spec, "/root/ml-env")
    assert out is not None
    assert out.env == {"SGLANG_MOE_CONFIG_DIR": "/srv/fc/current/kernels"}
    assert sorted(out.files) == sorted([*builtin, f"triton_3_4_0/{H200}", f"triton_3_6_0/{H200_DOWN}",
                                        f"triton_3_6_0/{H200}"])
    assert out.replaced == [f"triton_3_4_0/{H200_FP8}"]
    assert out.manifest()["triton_folder"] == "triton_3_4_0"
    assert session.calls[1] == ("kernel_configs", {"op": "inspect", "contents": True, "texts_named": []},
                                "/root/ml-env/bin/python")


def test_release_step_refuses_without_gpu_name_or_built_in_folder(tmp_path: Path) -> None:
    spec = load_spec(kernel_spec(tmp_path))
    with pytest.raises(KernelsRefused, match="kernels: no GPU name .nvidia-smi not found.: set the host var gpu_name"):
        release_kernels(ScriptedSession({}, {}), spec, "/root/ml-env")
    no_sglang = ScriptedSession({"gpu_name": "NVIDIA H200"}, {})
    no_sglang.call = lambda op, params=None, **kw: ({"nvidia_smi": None} if op == "facts"  # type: ignore[method-assign]
                                                    else {"python": "p", "triton": None, "sglang": None})
    with pytest.raises(KernelsRefused, match="no SGLang fused-MoE config folder in /root/ml-env"):
        release_kernels(no_sglang, spec, "/root/ml-env")
    plain = load_spec(Path(__file__).resolve().parents[1] / "playbooks" / "releases" / "sglang-0.5.23-lab.yml")
    assert release_kernels(ScriptedSession({}, {}), plain, "/root/ml-env") is None


# --- the host-side module, run here on a fake site-packages -----------------------------------------

def remote_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleetctl_remote_kernel_configs", REMOTE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_remote_module_reads_triton_version_and_built_in_folders(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "triton").mkdir(parents=True)
    (site / "triton" / "__init__.py").write_text("__version__ = '3.4.0'\n")
    cfg = site / "sglang" / "srt" / "layers" / "moe" / "fused_moe_triton" / "configs"
    (cfg / "triton_3_4_0").mkdir(parents=True)
    (cfg / "triton_3_4_0" / H200).write_text("{}")
    (cfg / "README.md").write_text("x")
    (site / "sglang" / "__init__.py").write_text("")
    (cfg.parent / "fused_moe_triton_config.py").write_text('supported_triton_versions = ["3.4.0", "3.3.1"]\n')
    (site / "sglang-0.5.9.dist-info").mkdir()
    (site / "sglang-0.5.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.9\n")
    monkeypatch.syspath_prepend(str(site))
    answer = remote_module().main({"op": "inspect", "contents": True})
    assert answer["triton"] == {"version": "3.4.0", "path": str(site / "triton"), "source": "triton/__init__.py"}
    sg = answer["sglang"]
    assert (sg["version"], sg["configs_dir"], sg["fallback_order"]) == ("0.5.9", str(cfg), ["3.4.0", "3.3.1"])
    assert sg["folders"] == {"triton_3_4_0": [H200]} and sg["files"] == {f"triton_3_4_0/{H200}": "{}"}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / H200).write_text("{}")
    (tmp_path / "out" / "notes.txt").write_text("")
    got = remote_module().main({"op": "collect", "src": str(tmp_path / "out")})
    assert (got["exists"], got["files"], got["triton"]["version"]) == (True, {H200: "{}"}, "3.4.0")
    assert remote_module().main({"op": "collect", "src": str(tmp_path / "nope")})["exists"] is False


# --- the CLI on a local host (real agent, no SSH) ---------------------------------------------------


def local_inventory(tmp_path: Path, **host_vars: str) -> str:
    path = tmp_path / "inventory.yml"
    path.write_text(json.dumps({"all": {"hosts": {"here": {"ansible_connection": "local", "venv": sys.prefix,
                                                              **host_vars}}}}))
    return str(path)


def kcli(capsys: pytest.CaptureFixture[str], inventory: str, *args: str) -> CliRun:
    return run_cli(capsys, "-i", inventory, "kernels", *args)


def test_cli_plan_on_a_local_host_with_stand_in_vars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = local_inventory(tmp_path, gpu_name="NVIDIA H200", triton_version="3.6.0")
    r = kcli(capsys, inv, "plan", "--dir", str(TUNED), "--json")
    assert r.rc == 0, r.err
    value = r.json()["hosts"]["here"]["value"]
    assert (value["device_names"], value["triton_folder"]) == (["NVIDIA_H200"], "triton_3_6_0")
    assert value["facts"]["gpu_source"].startswith("host var gpu_name: ")
    assert value["facts"]["triton_source"] == f"host var triton_version: triton not installed in {sys.prefix}"
    assert {e["filename"]: e["status"] for e in value["entries"]} == {
        H200_FP8: "fallback", H200_DOWN: "exact", H200: "exact"}
    r = kcli(capsys, inv, "plan", "--dir", str(TUNED), "--strict")
    assert r.rc == 1 and "FALLBACK" in r.out and "warning: E=128,N=192" in " ".join(r.out.split())
    bad = kcli(capsys, inv, "plan", "--dir", str(KFIX / "bad" / "wrong-key"))
    assert bad.rc == 3 and "key '64': missing GROUP_SIZE_M" in bad.err


def test_cli_collect_from_a_local_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = local_inventory(tmp_path, triton_version="3.6.0")
    src, dest = tmp_path / "tune-out", tmp_path / "kernels"
    src.mkdir()
    (src / H200).write_text(json.dumps(GOOD))
    (src / "tuning-log.json").write_text("{}")
    r = kcli(capsys, inv, "collect", "--from", "here", "--src", str(src), "--dest", str(dest), "--json")
    assert r.rc == 0, r.err
    assert r.json()["files"][0]["action"] == "added" and r.json()["skipped"] == ["tuning-log.json"]
    assert (dest / "triton_3_6_0" / H200).read_text() == json.dumps(GOOD)
    (src / H200).write_text(json.dumps({"2": GOOD["1"]}))
    r = kcli(capsys, inv, "collect", "--from", "here", "--src", str(src), "--dest", str(dest))
    assert r.rc == 1 and "differ" in r.err and (dest / "triton_3_6_0" / H200).read_text() == json.dumps(GOOD)
    assert kcli(capsys, inv, "collect", "--from", "here", "--src", str(src), "--dest", str(dest), "--force").rc == 0
    assert json.loads((dest / "triton_3_6_0" / H200).read_text()) == {"2": GOOD["1"]}


# --- captured on a real H200 ------------------------------------------------------------------------

def test_captured_h200_plan_names_the_gpu_and_its_triton_folder() -> None:
    text = (KFIX / "h200-kernels-plan.txt").read_text()
    assert "GPU:    NVIDIA H200 -> NVIDIA_H200 (nvidia-smi)" in text
    assert "triton: 3.6.0 -> triton_3_6_0 (/opt/torch/.venv)" in text
    check = dict(line.split(": ", 1) for line in (KFIX / "h200-torch-check.txt").read_text().splitlines()
                 if ": " in line)
    smi_name = (KFIX / "h200-torch-check.txt").read_text().splitlines()[-1]
    assert check["torch.cuda.get_device_name"] == smi_name == "NVIDIA H200"  # SGLang's name = nvidia-smi's
    assert check["triton.__version__"] == "3.6.0"


def test_captured_h200_facts_give_the_same_plan_again() -> None:
    value = json.loads((KFIX / "h200-kernels-plan.json").read_text())["hosts"]["h200"]["value"]
    facts = k.KernelHost(**value["facts"])
    samples = k.load_tuned(Path(__file__).resolve().parents[1] / "playbooks" / "files" / "kernels")
    plan = k.plan_host("h200", facts, samples)
    assert [e.__dict__ for e in plan.entries] == value["entries"]
    assert plan.warnings == value["warnings"]


def _pair(tmp_path: Path, down_m: int) -> k.TunedSet:
    """A tuned up config and its _down sibling in one triton folder, BLOCK_SIZE_M 16 and ``down_m``."""
    folder = tmp_path / "triton_3_4_0"
    folder.mkdir(parents=True, exist_ok=True)
    up = "E=64,N=128,device_name=NVIDIA_H200.json"
    (folder / up).write_text(json.dumps(GOOD))
    (folder / up.replace(".json", "_down.json")).write_text(
        json.dumps({"1": {**GOOD["1"], "BLOCK_SIZE_M": down_m}}))
    return k.load_tuned(tmp_path)


def test_an_up_config_without_its_down_file_runs_the_down_projection_too(tmp_path: Path) -> None:
    folder = tmp_path / "triton_3_4_0"
    folder.mkdir()
    (folder / "E=64,N=128,device_name=NVIDIA_H200.json").write_text(json.dumps(GOOD))
    plan = k.plan_host("gpu01", host("3.4.0"), k.load_tuned(tmp_path))
    assert ("triton_3_4_0/E=64,N=128,device_name=NVIDIA_H200.json: no E=64,N=128,device_name=NVIDIA_H200_down.json "
            "in triton_3_4_0: the down projection uses this (up) config") in plan.notes
    assert not plan.refusals
    assert not [n for n in k.plan_host("gpu01", host("3.4.0"), _pair(tmp_path / "b", 16)).notes if "_down" in n]


def test_a_down_config_disagreeing_on_block_size_m_is_refused_for_sglang_0_5_9_only(tmp_path: Path) -> None:
    tuned = _pair(tmp_path, 32)
    old = k.plan_host("old", host("3.4.0", sglang_version="0.5.9"), tuned)
    assert old.refusals == ["triton_3_4_0/E=64,N=128,device_name=NVIDIA_H200_down.json (tuned): BLOCK_SIZE_M "
                            "differs from triton_3_4_0/E=64,N=128,device_name=NVIDIA_H200.json (tuned) for batch "
                            "size 1: sglang 0.5.9 asserts they agree (0.5.23 and later do not)"]
    assert k.plan_host("new", host("3.4.0"), tuned).refusals == []
    assert k.plan_host("old", host("3.4.0", sglang_version="0.5.9"), _pair(tmp_path / "same", 16)).refusals == []


# The real up/down pair both versions ship built in (triton_3_4_0 and triton_3_5_1 of each wheel).
H20_UP = "E=257,N=256,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json"
H20_DOWN = H20_UP.replace(".json", "_down.json")


def real_host(version: str) -> k.KernelHost:
    """An H20 host with triton 3.4.0 and the built-in config names of the real sglang ``version``
    wheel, its 0.5.9 fixed fallback list where it has one."""
    names = REAL_NAMES_059 if version == "0.5.9" else REAL_NAMES
    return host("3.4.0", gpu="NVIDIA H20", sglang_version=version, builtin=builtin_0523(names),
                fixed_order=["3.4.0", "3.3.1", "3.2.0", "3.1.0"] if version == "0.5.9" else None)


def entries(block_m: dict[int, int], warps: bool = True) -> str:
    launch = {"num_warps": 4, "num_stages": 3} if warps else {}
    return json.dumps({str(b): {**GOOD["1"], **launch, "BLOCK_SIZE_M": m} if warps else
                       {k_: v for k_, v in {**GOOD["1"], "BLOCK_SIZE_M": m}.items() if k_ not in k.LAUNCH_KEYS}
                       for b, m in block_m.items()})


def tuned_set(tmp_path: Path, files: dict[str, str]) -> k.TunedSet:
    folder = tmp_path / "triton_3_4_0"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return k.load_tuned(tmp_path)


def test_real_names_both_versions_have_the_h20_pair_built_in() -> None:
    for names in (REAL_NAMES, REAL_NAMES_059):
        assert {f"triton_3_4_0/{H20_UP}", f"triton_3_4_0/{H20_DOWN}"} <= set(names)


def test_tuned_down_disagreeing_with_its_tuned_up_refused_on_0_5_9_not_0_5_23(tmp_path: Path) -> None:
    tuned = tuned_set(tmp_path, {H20_UP: entries({1: 16, 64: 64}), H20_DOWN: entries({1: 16, 64: 32})})
    old = k.plan_host("old", real_host("0.5.9"), tuned)
    assert old.refusals == [f"triton_3_4_0/{H20_DOWN} (tuned): BLOCK_SIZE_M differs from triton_3_4_0/{H20_UP} "
                            "(tuned) for batch size 64: sglang 0.5.9 asserts they agree (0.5.23 and later do not)"]
    assert k.plan_host("new", real_host("0.5.23"), tuned).refusals == []


def test_a_tuned_down_file_alone_is_checked_against_the_built_in_up_it_pairs_with(tmp_path: Path) -> None:
    """Only the _down file tuned: SGLang 0.5.9 pairs it with its own built-in up config (the text
    the host answers); SGLang picks each side's entry nearest M, batch keys need not match."""
    tuned = tuned_set(tmp_path, {H20_DOWN: entries({1: 16, 96: 128})})
    builtin_up = {f"triton_3_4_0/{H20_UP}": entries({1: 16, 32: 32, 128: 64})}
    assert H20_UP in k.sibling_names(tuned)
    old = k.plan_host("old", real_host("0.5.9"), tuned, builtin_up)
    assert old.refusals == [f"triton_3_4_0/{H20_DOWN} (tuned): BLOCK_SIZE_M differs from triton_3_4_0/{H20_UP} "
                            "(built-in) for batch size 32, 96, 128: sglang 0.5.9 asserts they agree (0.5.23 and "
                            "later do not)"]
    agree = {f"triton_3_4_0/{H20_UP}": entries({1: 16, 96: 128})}
    assert k.plan_host("old", real_host("0.5.9"), tuned, agree).refusals == []
    assert k.plan_host("new", real_host("0.5.23"), tuned, builtin_up).refusals == []


def test_no_num_warps_or_num_stages_only_warns_on_both_versions(tmp_path: Path) -> None:
    """SGLang 0.5.23 ships such files itself (triton_3_7_1/E=256,N=512,device_name=NVIDIA_H200.json)."""
    assert "triton_3_7_1/E=256,N=512,device_name=NVIDIA_H200.json" in REAL_NAMES
    tuned = tuned_set(tmp_path, {H20_UP: entries({1: 16}, warps=False), H20_DOWN: entries({1: 16}, warps=False)})
    for version in ("0.5.9", "0.5.23"):
        plan = k.plan_host(version, real_host(version), tuned)
        assert plan.refusals == []
        assert f"triton_3_4_0/{H20_UP}: batch size 1 has no num_warps/num_stages: SGLang loads it with Triton's " \
               "defaults (as some of its own configs)" in plan.warnings
