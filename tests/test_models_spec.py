"""The release spec's ``models:`` (fleetctl/models/spec.py): the launch args name them by role, their
revisions are part of the release id, servers run offline unless the spec says otherwise, and a bad entry
is one line naming the spec file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.errors import FleetError
from fleetctl.release.service import command, env_file, layout_for, stored_params
from fleetctl.release.spec import load_spec

REV = "0123456789abcdef0123456789abcdef01234567"


def spec_file(folder: Path, models: str) -> Path:
    path = folder / "m.yml"
    path.write_text(
        "name: m\nversion: '1'\nbase: {adopt: /root/ml-env}\n"
        f"models:\n{models}"
        "service:\n  args: [--model-path, '{{ models.main.path }}', --speculative-draft-model-path,\n"
        "         '{{ models.draft.path }}', --speculative-draft-model-revision, '{{ models.draft.revision }}']\n"
        )
    return path


MODELS = (f"  main: {{path: /srv/models/Qwen3.6-35B-A3B}}\n"
          f"  draft: {{hf_cache: /srv/hub, repo: z-lab/Qwen3.6-DFlash, revision: {REV}}}\n")


def test_args_name_the_models_and_servers_run_offline(tmp_path: Path) -> None:
    spec = load_spec(spec_file(tmp_path, MODELS))
    argv = command(spec, layout_for({}))
    assert argv[argv.index("--model-path") + 1] == "/srv/models/Qwen3.6-35B-A3B"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == (
        f"/srv/hub/models--z-lab--Qwen3.6-DFlash/snapshots/{REV}")
    assert argv[argv.index("--speculative-draft-model-revision") + 1] == REV
    assert "HF_HUB_OFFLINE=1" in env_file(spec).splitlines()
    stored = stored_params(spec, layout_for({}))["models"]
    assert stored["draft"]["revision"] == REV and stored["main"]["layout"] == "folder"  # type: ignore[index]


def test_the_spec_may_let_servers_download(tmp_path: Path) -> None:
    path = spec_file(tmp_path, MODELS)
    path.write_text(path.read_text().replace("service:\n", "service:\n  env: {HF_HUB_OFFLINE: '0'}\n"))
    env = env_file(load_spec(path)).splitlines()
    assert "HF_HUB_OFFLINE=0" in env and "HF_HUB_OFFLINE=1" not in env


def test_a_model_revision_is_part_of_the_release_id(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = load_spec(spec_file(tmp_path / "a", MODELS))
    b = load_spec(spec_file(tmp_path / "b", MODELS.replace(REV, "f" * 40)))
    assert load_spec(spec_file(tmp_path, MODELS)).release_id == a.release_id  # same text, same release
    assert a.release_id != b.release_id
    assert [m.revision for m in b.models if m.role == "draft"] == ["f" * 40]


@pytest.mark.parametrize("models, says", [
    ("  main: {hf_cache: /srv/hub, repo: org/x, revision: main}\n", "must be a 40-hex commit"),
    ("  main: {path: models/x}\n", "absolute path"),
    ("  main: {path: /m, hf_cache: /srv/hub}\n", "either path"),
    ("  main-model: {path: /m}\n", "not a name templates can use"),
    ("  main: {hf_cache: /srv/hub, repo: org/x}\n", "needs repo"),
])
def test_a_bad_models_entry_is_one_line_naming_the_spec(tmp_path: Path, models: str, says: str) -> None:
    path = spec_file(tmp_path, models)
    with pytest.raises(FleetError) as err:
        load_spec(path)
    text = str(err.value)
    assert str(path) in text and says in text and "\n" not in text.strip()
