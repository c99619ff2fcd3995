"""Kept-connection server pieces that need no lab: keys, errors across the socket, the folder rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetctl.errors import AgentError, ConnectError, HostKeyError, InputError, RemoteOperationError
from fleetctl.transport import mux, mux_server
from fleetctl.transport.target import Become, SSHTarget


def _target(tmp_path: Path, **over: object) -> SSHTarget:
    known = tmp_path / "known_hosts"
    known.touch()
    fields: dict[str, object] = dict(hostname="10.0.0.1", port=22, user="root", known_hosts=known,
                                     connect_timeout=10.0)
    fields.update(over)
    return SSHTarget(**fields)  # type: ignore[arg-type]


def test_a_connection_key_changes_with_whatever_decides_the_connection(tmp_path: Path) -> None:
    doc = mux.target_doc(_target(tmp_path))
    base = mux_server.entry_key("gpu1", doc, ["python3"])
    assert mux_server.entry_key("gpu1", doc, ["python3"]) == base
    assert mux_server.entry_key("gpu2", doc, ["python3"]) != base
    assert mux_server.entry_key("gpu1", {**doc, "port": 2222}, ["python3"]) != base
    assert mux_server.entry_key("gpu1", doc, ["/opt/venv/bin/python", "python3"]) != base
    become = mux.target_doc(_target(tmp_path, become=Become("root")))
    assert mux_server.entry_key("gpu1", become, ["python3"]) != base  # an agent under sudo is another agent
    other = mux.target_doc(_target(tmp_path, become=Become("svc")))
    assert mux_server.entry_key("gpu1", other, ["python3"]) != mux_server.entry_key("gpu1", become, ["python3"])
    known = Path(doc["known_hosts"])
    known.write_text("10.0.0.1 ssh-ed25519 AAAA\n")  # re-pinned or revoked: a new, checked connection
    assert mux_server.entry_key("gpu1", doc, ["python3"]) != base


def test_a_target_travels_intact_with_its_bastion(tmp_path: Path) -> None:
    jump = _target(tmp_path, hostname="bastion", port=2200, user="ops")
    target = _target(tmp_path, key_files=("/root/.ssh/id_ed25519",), jump=jump, become=Become("root", "pw"))
    assert mux.target_from_doc(mux.target_doc(target)) == target


@pytest.mark.parametrize("exc", [
    ConnectError("gpu1", "cannot connect to 10.0.0.1:22: Connection refused"),
    HostKeyError("gpu1", "host key for 10.0.0.1 changed"),
    AgentError("gpu1", "agent died"),
    RemoteOperationError("gpu1", "source", "FileNotFoundError", "no sglang", "Traceback ..."),
])
def test_errors_cross_the_socket_as_the_same_class(exc: Exception) -> None:
    with pytest.raises(type(exc)) as got:
        mux.raise_payload("gpu1", mux.error_payload(exc))
    assert type(got.value) is type(exc)
    assert str(got.value) == str(exc)
    if isinstance(exc, RemoteOperationError):
        assert isinstance(got.value, RemoteOperationError)
        assert got.value.etype == exc.etype and got.value.remote_traceback == exc.remote_traceback


def test_the_socket_folder_must_be_private_and_ours(tmp_path: Path) -> None:
    good = mux.private_dir(tmp_path / "a" / "mux")
    assert (os.stat(good).st_mode & 0o777) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    with pytest.raises(InputError, match="0700"):
        mux.private_dir(open_dir)
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(InputError, match="owned by this user"):
        mux.private_dir(link)


def test_no_server_means_nothing_to_list_or_stop(tmp_path: Path) -> None:
    path = mux.socket_path(tmp_path)
    assert mux.server_status(path) is None
    assert mux.stop_server(path) is None


def test_a_socket_path_too_long_for_unix_sockets_is_one_line_naming_the_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from cli_support import run_cli

    deep = tmp_path / ("d" * 100) / "mux"
    monkeypatch.setenv("FLEETCTL_MUX_DIR", str(deep))
    assert len(os.fsencode(mux.socket_path(deep))) > mux.SUN_PATH_MAX
    with pytest.raises(InputError, match="too long for the persistent-connection socket"):
        mux.server_status(mux.socket_path(deep))
    r = run_cli(capsys, "connections", "list")  # before: a raw OSError "AF_UNIX path too long"
    assert r.rc == 3, r.out + r.err
    assert r.err.strip().splitlines()[-1].endswith("set FLEETCTL_MUX_DIR to a shorter folder"), r.err
    assert "Traceback" not in r.err


def test_a_server_that_dies_as_it_is_asked_means_no_server(tmp_path: Path) -> None:
    """A killed server's socket can still accept (the kernel's backlog) and then reset: no server ran."""
    import socket
    import threading

    path = mux.socket_path(tmp_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)

    def accept_and_drop(n: int) -> None:
        for _ in range(n):
            conn, _ = listener.accept()
            conn.close()

    dropper = threading.Thread(target=accept_and_drop, args=(2,), daemon=True)
    dropper.start()
    try:
        assert mux.server_status(path) is None
        assert mux.stop_server(path, wait_s=0) is None
    finally:
        dropper.join(timeout=10)
        listener.close()
