"""The malformed-input corpus (tests/fixtures/malformed): every case is refused with exactly the
line expected.txt gives, exit code 3, never a traceback or a hang."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import run_cli
from lab_support import REPO

CORPUS = Path("tests/fixtures/malformed")  # relative: the messages name the files as given
OK_INVENTORY = str(CORPUS / "ok-inventory.yml")


def _expected() -> dict[str, tuple[int, str]]:
    rows = {}
    for line in (REPO / CORPUS / "expected.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            case, rc, message = line.split(" | ", 2)
            rows[case] = (int(rc), message)
    return rows


EXPECTED = _expected()


def _args(case: str, tmp_path: Path) -> list[str]:
    kind, _, _name = case.partition("/")
    path = str(CORPUS / case)
    if kind == "inventory":
        return ["-i", path, "hosts"]
    if kind == "spec":
        return ["-i", OK_INVENTORY, "deploy", path, "--check"]
    if kind == "playbook":
        return ["-i", OK_INVENTORY, "run", path]
    if kind == "kernels":
        return ["-i", OK_INVENTORY, "kernels", "plan", "--dir", path]
    assert kind == "patches", case
    spec = tmp_path / "spec.yml"
    spec.write_text(f'name: r\nversion: "1"\nbase: {{adopt: /root/ml-env}}\npatches:\n'
                    f'  - {{file: {REPO / path}, distribution: sglang, version: "0.5.23"}}\n')
    return ["-i", OK_INVENTORY, "deploy", str(spec), "--check"]


def test_every_case_has_an_expected_line() -> None:
    cases = {f"{kind.name}/{p.name}" for kind in (REPO / CORPUS).iterdir() if kind.is_dir() for p in kind.iterdir()}
    assert cases == set(EXPECTED)


def test_the_readme_counts_the_corpus() -> None:
    """The reliability table's numbers are the corpus's: 40 non-playbook cases, 14 playbooks."""
    readme = (REPO / "docs" / "reference" / "reliability.md").read_text(encoding="utf-8")
    playbooks = sum(case.startswith("playbook/") for case in EXPECTED)
    assert f"| {len(EXPECTED) - playbooks} malformed inventories, release specs, kernel configs, patches (" in readme
    assert f"| {playbooks} malformed playbooks (" in readme


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_malformed_input_is_one_exact_line(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FLEETCTL_LOG_DIR", str(tmp_path / "logs"))
    rc, message = EXPECTED[case]
    r = run_cli(capsys, *_args(case, tmp_path))
    lines = r.err.strip().splitlines()
    assert (r.rc, lines[-1].replace(f"{REPO}/", "") if lines else "") == (rc, message)
    assert len(lines) == 1 and "Traceback" not in r.err and not (tmp_path / "logs").exists()
