"""What a release records for restarts (``service.json``): `service start|restart` read the health
interval the deploy used from it; a release with the default interval records nothing new, so
upgrading fleetctl never turns a serving release into a reconfigure."""

from __future__ import annotations

from pathlib import Path

from fleetctl.release.service import layout_for, stored_params
from fleetctl.release.spec import load_spec
from fleetctl.remote.service_host import stored_fields


def spec(folder: Path, health: str) -> Path:
    path = folder / "s.yml"
    path.write_text(f"name: s\nversion: '1'\nbase: {{adopt: /root/ml-env}}\nservice:\n  standin: true\n{health}")
    return path


def test_a_release_records_its_health_interval_for_restarts(tmp_path: Path) -> None:
    stored = stored_params(load_spec(spec(tmp_path, "health: {interval: 0.2}\n")), layout_for({}))
    assert stored["health_interval"] == 0.2
    assert stored_fields(stored)["health_interval"] == 0.2  # status and the restart gate read it


def test_the_default_interval_records_nothing_new(tmp_path: Path) -> None:
    stored = stored_params(load_spec(spec(tmp_path, "")), layout_for({}))
    assert "health_interval" not in stored and "health_interval" not in stored_fields(stored)
