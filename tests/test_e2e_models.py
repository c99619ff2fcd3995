"""Models on the lab fleet (real sshd hosts): test models made here with the safetensors package, put on
each host as a plain folder and as a Hugging Face cache. ``models status`` is green where they are intact; a
truncated shard is named with its host by the quick tier; a byte flipped in place (dd conv=notrunc, the size
kept) after a verification is caught by the rehash of changed files, so ``deploy`` refuses that host before
its switch while the others deploy; ``drift`` names the host holding another revision."""

from __future__ import annotations

import io
import shlex
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_support import CliRun, run_cli
from lab_support import LabHandle
from model_support import MadeModel, make_folder_model, make_hf_cache_model

from fleetctl.models import manifest as mf
from fleetctl.release.spec import load_spec
from fleetctl.transport import mux

pytestmark = pytest.mark.lab
FOLDER, HUB = "/srv/models/tiny", "/srv/hub"
SHARD2 = f"{FOLDER}/model-00002-of-00002.safetensors"


@dataclass
class ModelsLab:
    lab: LabHandle
    folder: MadeModel
    hub: MadeModel
    spec: Path

    def cli(self, capsys: pytest.CaptureFixture[str], *args: str) -> CliRun:
        return run_cli(capsys, "-i", str(self.lab.inventory_path), *args)

    def put(self, host: str, local: Path, remote: str) -> None:
        """``local`` as ``remote`` on ``host`` (symlinks kept), replacing what was there."""
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            tar.add(local, arcname=".")
        q = shlex.quote(remote)
        argv = ["ssh", *self.lab.ssh_options(), f"root@{self.lab.addresses[host]}",
                f"rm -rf {q} && mkdir -p {q} && tar -C {q} -xf -"]
        subprocess.run(argv, input=data.getvalue(), check=True, capture_output=True, timeout=120)

    def put_models(self, host: str) -> None:
        self.put(host, self.folder.path, FOLDER)
        self.put(host, self.hub.root, HUB)


def write_spec(folder: Path, draft: MadeModel) -> Path:
    spec = folder / "models-lab.yml"
    spec.write_text(
        "name: models-lab\nversion: '1'\nbase: {adopt: /root/ml-env}\nrequires: {sglang: '==0.5.23'}\n"
        f"models:\n  main: {{path: {FOLDER}}}\n"
        f"  draft: {{hf_cache: {HUB}, repo: {draft.repo}, revision: {draft.revision}}}\n"
        "service:\n  standin: true\n"
        "  args: [--model-path, '{{ models.main.path }}', --speculative-draft-model-path, '{{ models.draft.path }}']\n"
        "health: {timeout: 60, interval: 0.2}\n")
    return spec


@pytest.fixture(scope="module")
def models_lab(release_free_lab: LabHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsLab]:
    local = tmp_path_factory.mktemp("models")
    folder = make_folder_model(local / "tiny", shards=2)
    mf.dump(mf.build_from_folder(folder.path), mf.manifest_path("folder", str(folder.path)))
    hub = make_hf_cache_model(local / "hub", repo="fleetctl-test/tiny-draft")
    handle = ModelsLab(release_free_lab, folder, hub, write_spec(local, hub))
    for host in release_free_lab.hosts:
        handle.put_models(host)
    yield handle
    for host in release_free_lab.hosts:
        release_free_lab.ssh(host, f"rm -rf /srv/models {HUB}", check=False)


def states(run: CliRun) -> dict[tuple[str, str], str]:
    return {(h, m["role"]): m["state"] for h, v in run.json()["hosts"].items() for m in v.get("value") or []}


def test_status_is_green_where_the_models_are_intact(models_lab: ModelsLab,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    r = models_lab.cli(capsys, "-l", "all", "models", "status", str(models_lab.spec), "--json")
    assert r.rc == 0, r.out + r.err
    assert set(states(r).values()) == {"ok"} and len(states(r)) == 2 * len(models_lab.lab.hosts)
    lab1 = {m["role"]: m for m in r.json()["hosts"]["lab1"]["value"]}
    assert lab1["draft"]["revision"] == models_lab.hub.revision
    assert lab1["main"]["revision"] == mf.build_from_folder(models_lab.folder.path).revision
    assert lab1["main"]["bytes"] > 0 and lab1["main"]["free_bytes"] > 0
    table = models_lab.cli(capsys, "-l", "all", "models", "status", str(models_lab.spec))
    assert table.rc == 0 and "lab3" in table.out and "draft" in table.out


def test_a_truncated_shard_is_named_with_its_host(models_lab: ModelsLab, capsys: pytest.CaptureFixture[str]) -> None:
    models_lab.lab.ssh("lab2", f"truncate -s -1000 {SHARD2}")
    try:
        r = models_lab.cli(capsys, "-l", "all", "models", "status", str(models_lab.spec))
        assert r.rc == 1, r.out + r.err
        assert f"lab2: model main: {SHARD2}: size " in r.err and "truncated" in r.err
        assert "lab1: model" not in r.err and "lab3: model" not in r.err
        folder = models_lab.cli(capsys, "-l", "all", "models", "verify", FOLDER, "--json")
        assert folder.rc == 1 and states(folder) == {("lab1", "tiny"): "ok", ("lab2", "tiny"): "incomplete",
                                                     ("lab3", "tiny"): "ok"}
    finally:
        models_lab.put_models("lab2")


def test_a_flipped_byte_refuses_that_host_before_its_switch(models_lab: ModelsLab,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    lab, spec = models_lab.lab, str(models_lab.spec)
    assert models_lab.cli(capsys, "-l", "lab1,lab3", "models", "verify", spec).rc == 0  # hashed, remembered
    lab.ssh("lab3", f"printf FLEETCTL | dd of={SHARD2} bs=1 seek=$(( $(stat -c %s {SHARD2}) - 100 )) conv=notrunc")
    assert models_lab.cli(capsys, "-l", "lab3", "models", "status", spec).rc == 0  # same size, headers intact
    r = models_lab.cli(capsys, "-l", "lab1,lab3", "deploy", spec, "--json")
    hosts = r.json()["hosts"]
    assert r.rc == 2, r.out + r.err
    assert hosts["lab1"]["status"] == "ok" and hosts["lab1"]["value"]["outcome"] == "deployed"
    assert {m["role"]: m["state"] for m in hosts["lab1"]["value"]["models"]} == {"main": "ok", "draft": "ok"}
    assert hosts["lab3"]["status"] == "failed"
    assert hosts["lab3"]["reason"].startswith(f"model main: {SHARD2}: sha256 "), hosts["lab3"]["reason"]
    assert "manifest says" in hosts["lab3"]["reason"] and "\n" not in hosts["lab3"]["reason"]
    assert lab.ssh("lab3", "test -e /opt/fleetctl/current", check=False).returncode != 0  # never switched
    rid = load_spec(spec).release_id
    assert lab.ssh("lab1", "readlink /opt/fleetctl/current").stdout.strip().endswith(rid)
    env = lab.ssh("lab1", "cat /opt/fleetctl/current/service.env").stdout
    assert "HF_HUB_OFFLINE=1" in env.splitlines()
    status = models_lab.cli(capsys, "-l", "lab1", "status", "--json").json()["hosts"]["lab1"]["value"]
    assert [(m["role"], m["state"]) for m in status["models"]] == [("draft", "ok"), ("main", "ok")]
    assert f"--model-path {FOLDER}" in " ".join(status["argv"])
    models_lab.put_models("lab3")
    again = models_lab.cli(capsys, "-l", "lab3", "deploy", spec, "--json")
    assert again.rc == 0, again.out + again.err


def test_drift_names_the_host_holding_another_revision(models_lab: ModelsLab, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    lab, spec = models_lab.lab, str(models_lab.spec)
    for host in ("lab1", "lab3"):
        if lab.ssh(host, "test -e /opt/fleetctl/current", check=False).returncode != 0:
            assert models_lab.cli(capsys, "-l", host, "deploy", spec).rc == 0
    other = make_folder_model(tmp_path / "tiny", seed="another checkpoint")
    mf.dump(mf.build_from_folder(other.path), mf.manifest_path("folder", str(other.path)))
    models_lab.put("lab3", other.path, FOLDER)
    try:
        r = models_lab.cli(capsys, "-l", "lab1,lab3", "drift", "--venv", "/root/ml-env", "--baseline", "lab1",
                           "--json")
        assert r.rc == 1, r.out + r.err
        doc = r.json()
        lab3 = [f for f in doc["hosts"]["lab3"]["findings"] if f["package"] == "model main"]
        assert lab3 and lab3[0]["actual"] == mf.build_from_folder(other.path).revision
        assert lab3[0]["expected"] == mf.build_from_folder(models_lab.folder.path).revision
        assert not [f for f in doc["hosts"]["lab1"]["findings"] if f["package"] == "model main"]
    finally:
        models_lab.put_models("lab3")


def test_status_over_kept_connections_answers_as_over_fresh_ones(
        models_lab: ModelsLab, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETCTL_MUX_DIR", str(tmp_path / "mux"))
    args = ("-l", "all", "models", "status", str(models_lab.spec), "--json")
    fresh = models_lab.cli(capsys, *args)
    try:  # the first run opens the kept connections, the second uses them (requests batched: mux_calls)
        kept = [models_lab.cli(capsys, "--persist", "60", *args) for _ in range(2)]
        assert len(mux.server_status(mux.socket_path(tmp_path / "mux")) or []) == len(models_lab.lab.hosts)
    finally:
        mux.stop_server(mux.socket_path(tmp_path / "mux"))

    def answers(run: CliRun) -> Any:  # free space moves between any two runs
        return {h: [{k: v for k, v in m.items() if k != "free_bytes"} for m in doc.get("value") or []]
                for h, doc in run.json()["hosts"].items()}

    assert fresh.rc == 0, fresh.out + fresh.err
    assert [(r.rc, answers(r)) for r in kept] == [(0, answers(fresh))] * 2
