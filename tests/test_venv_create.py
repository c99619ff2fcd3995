"""``venv create`` planning (pure), its input checks and the host-side installer commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli

from fleetctl import venv_create as core
from fleetctl.errors import InputError
from fleetctl.lockfile import Pin
from fleetctl.transport.agent import module_source


def _pins(**versions: str) -> dict[str, Pin]:
    return {n: Pin(n, v, i, f"{n}=={v}") for i, (n, v) in enumerate(versions.items(), 1)}


def _wheel(tmp_path: Path, filename: str) -> core.Wheel:
    return core.Wheel(filename, tmp_path / filename, "h-" + filename, 100)


def _state(installed: dict[str, str] | None = None, uv: str | None = None,
           wheels: dict[str, str | None] | None = None) -> core.HostState:
    return core.HostState("/usr/bin/python3", "3.11.2", uv, installed is not None, "3.11.2", installed or {},
                          wheels or {})


def test_lock_plan_installs_what_differs_and_removes_extras_but_pip(tmp_path: Path) -> None:
    wheels = (_wheel(tmp_path, "idna-3.20-py3-none-any.whl"), _wheel(tmp_path, "requests-2.32.3-py3-none-any.whl"))
    req = core.CreateRequest("/v", None, "x.lock", _pins(idna="3.20", requests="2.32.3"), wheels=wheels)
    plan = core.plan_create(req, _state({"idna": "3.20", "requests": "2.31.0", "pip": "23.0.1", "six": "1.16"},
                                        wheels={"requests-2.32.3-py3-none-any.whl": "stale"}))
    assert (plan.create, plan.install, plan.remove, plan.no_deps) == (False, ("requests==2.32.3",), ("six",), True)
    assert [w.filename for w in plan.upload] == ["requests-2.32.3-py3-none-any.whl"]
    assert plan.installer == "pip"


def test_nothing_to_change_uploads_nothing_and_uv_is_preferred(tmp_path: Path) -> None:
    wheels = (_wheel(tmp_path, "idna-3.20-py3-none-any.whl"),)
    req = core.CreateRequest("/v", None, "x.lock", _pins(idna="3.20"), wheels=wheels)
    plan = core.plan_create(req, _state({"idna": "3.20", "setuptools": "66"}, uv="/root/.local/bin/uv"))
    assert not plan.changes and plan.upload == () and plan.installer == "uv"
    fresh = core.plan_create(req, _state(None))
    assert fresh.create and fresh.install == ("idna==3.20",) and len(fresh.upload) == 1


def test_requirements_are_checked_against_their_specifiers(tmp_path: Path) -> None:
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("requests>=2.30  # http\n\nidna\n")
    req = core.load_request("/v", "3.11", reqs, None, None)
    assert not core.plan_create(req, _state({"requests": "2.32.3", "idna": "3.20"})).changes
    plan = core.plan_create(req, _state({"requests": "2.29.0", "idna": "3.20"}))
    assert plan.install == ("requests>=2.30", "idna") and not plan.no_deps and plan.remove == ()


@pytest.mark.parametrize(("text", "message"), [
    ("-r other.txt\n", "{p}:1: options like '-r' are not supported in a requirements file"),
    ("ok==1\nnot a req!\n", "{p}:2: not a requirement: 'not a req!'"),
])
def test_bad_requirements_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "r.txt"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        core.parse_requirements(path)
    assert str(err.value).startswith(message.format(p=path))


def test_input_errors(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text("idna==3.20\n")
    with pytest.raises(InputError, match="--python 3: expected a version like 3.11"):
        core.load_request("/v", "3", None, lock, None)
    with pytest.raises(InputError, match="no such folder"):
        core.load_request("/v", None, None, lock, tmp_path / "nope")
    (tmp_path / "house").mkdir()
    (tmp_path / "house" / "idna-3.7-py3-none-any.whl").write_bytes(b"x")
    with pytest.raises(InputError, match="no wheel of a pinned version"):
        core.load_request("/v", None, None, lock, tmp_path / "house")


def test_existing_venv_of_another_python_is_a_host_failure() -> None:
    req = core.CreateRequest("/v", "3.12", "x.lock", _pins(idna="3.20"))
    with pytest.raises(core.HostError, match="/v runs python 3.11.2, not 3.12"):
        core.check_state("h", req, _state({}))


def _remote() -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "fleetctl_remote_test"}
    exec(compile(module_source("venv_create")[0], "venv_create", "exec"), ns)  # noqa: S102 - our own code
    return ns


def test_installer_commands_offline_with_uv_and_pip() -> None:
    commands = _remote()["commands"]
    base = {"venv": "/v", "python": "/usr/bin/python3.11", "create": True, "install": ["a==1"], "remove": ["b"],
            "no_deps": True, "wheelhouse": "/w", "uv": "/u"}
    uv = commands(dict(base, installer="uv"), "/tmp/r.txt")
    assert uv == [["/u", "venv", "--quiet", "--python", "/usr/bin/python3.11", "/v"],
                  ["/u", "pip", "uninstall", "--quiet", "--python", "/v/bin/python", "b"],
                  ["/u", "pip", "install", "--quiet", "--python", "/v/bin/python", "-r", "/tmp/r.txt", "--no-deps",
                   "--offline", "--no-index", "--find-links", "/w"]]
    pip = commands(dict(base, installer="pip"), "/tmp/r.txt")
    assert pip[0] == ["/usr/bin/python3.11", "-m", "venv", "/v"]
    assert pip[2][-4:] == ["--no-deps", "--no-index", "--find-links", "/w"]
    assert "--no-compile" not in pip[2]
    assert commands(dict(base, installer="pip", no_compile=True), "/tmp/r.txt")[2][-1] == "--no-compile"
    assert commands(dict(base, installer="uv", no_compile=True), "/tmp/r.txt") == uv  # uv compiles nothing anyway


def test_create_cli_needs_exactly_one_pin_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n    a:\n      ansible_connection: local\n")
    r = run_cli(capsys, "-i", str(inv), "venv", "create", "--venv", "/v")
    assert r.rc == 3 and "exactly one of --requirements FILE and --lock FILE" in r.err
    bad = tmp_path / "bad.lock"
    bad.write_text("idna>=3\n")
    r = run_cli(capsys, "-i", str(inv), "venv", "create", "--venv", "/v", "--lock", str(bad))
    assert r.rc == 3 and r.err.strip() == f"fleetctl: error: {bad}:1: 'idna>=3' is not an exact pin " \
                                          "(expected name==version)"


def test_a_hashed_lock_pins_hashes_and_the_wheelhouse_is_checked_against_them(tmp_path: Path) -> None:
    import hashlib

    from fleetctl.hostpaths import wheelhouse_dir
    from fleetctl.lockfile import parse_lock

    house = tmp_path / "house"
    house.mkdir()
    whl = house / "idna-3.20-py3-none-any.whl"
    whl.write_bytes(b"wheel bytes")
    good = hashlib.sha256(b"wheel bytes").hexdigest()
    lock = tmp_path / "full.lock"
    lock.write_text(f"# a comment\nidna==3.20 --hash=sha256:{good}  # idna-3.20-py3-none-any.whl\n")
    pins = parse_lock(lock)
    assert pins["idna"].version == "3.20" and pins["idna"].hashes == (f"sha256:{good}",)
    (wheel,) = core.local_wheels(house, pins)
    assert wheel.sha256 == good
    lock.write_text(f"idna==3.20 --hash=sha256:{'0' * 64}\n")
    with pytest.raises(InputError, match=r"idna-3.20-py3-none-any.whl has sha256 .*line 1 of the lock"):
        core.local_wheels(house, parse_lock(lock))
    assert wheelhouse_dir({"fleetctl_wheelhouse": "/var/cache/w/"}) == "/var/cache/w"
    assert wheelhouse_dir({}) == "/var/lib/fleetctl/wheelhouse"


def test_the_full_environment_lock_is_complete_and_hashed() -> None:
    from fleetctl.lockfile import parse_lock

    pins = parse_lock(Path(__file__).parent.parent / "playbooks/files/locks/sglang-0.5.23-full.lock")
    assert len(pins) == 207 and all(len(p.hashes) == 1 for p in pins.values())
    assert {n: pins[n].version for n in ("sglang", "sglang-kernel", "torch", "flashinfer-python", "triton")} == {
        "sglang": "0.5.23", "sglang-kernel": "0.4.10", "torch": "2.14.1", "flashinfer-python": "0.7.2",
        "triton": "3.8.0"}
