"""Instances and systemd units without a host: args overrides, per-instance files, the units
systemd itself accepts (``systemd-analyze verify``) and their enable links; multi-node batches."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from fleetctl.errors import InputError
from fleetctl.release import instances
from fleetctl.release.service import command, env_file, layout_for, listen, unit
from fleetctl.release.spec import load_spec
from fleetctl.runs.rollout import batches

REMOTE = Path(__file__).resolve().parents[1] / "fleetctl" / "remote"

PAIR = """\
name: pair
version: "1"
base: {adopt: /root/ml-env}
service:
  user: daemon
  args: [--model-path, /m, --tp, "{{ tp_size }}", --dist-init-addr, "{{ dist_init_addr }}"]
  instances:
    - {name: tp4-a, gpus: "0,1,2,3", port: "{{ base_port }}", args: [--tp, "4"]}
    - {name: tp4-b, gpus: "4,5,6,7", port: "{{ base_port + 1 }}", args: [--tp, "4", --enable-metrics],
       env: {SGLANG_LOG: debug}}
"""


def pair(tmp_path: Path) -> Path:
    path = tmp_path / "pair.yml"
    path.write_text(PAIR)
    return path


def test_instance_args_replace_the_service_flags_and_ports_are_templates(tmp_path: Path) -> None:
    spec = load_spec(pair(tmp_path))
    layout = layout_for({"tp_size": 8, "base_port": 30001, "dist_init_addr": "10.0.0.1:5000"})
    a, b = instances.of_spec(spec)
    assert command(spec, layout, b)[3:] == ["--model-path", "/m", "--dist-init-addr", "10.0.0.1:5000", "--tp", "4",
                                            "--enable-metrics", "--host", "127.0.0.1", "--port", "30002"]
    assert listen(spec, layout, a) == ("127.0.0.1", 30001)
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7\n" in env_file(spec, None, layout.host_vars, b)
    assert "SGLANG_LOG=debug\n" in env_file(spec, None, layout.host_vars, b)
    assert (a.unit_name, a.params_name, a.env_name) == ("sglang@tp4-a", "service.tp4-a.json", "service.tp4-a.env")
    assert instances.release_record(spec) == {"release_id": spec.release_id, "instances": ["tp4-a", "tp4-b"]}
    with pytest.raises(InputError, match=r"pair.yml: service.instances.tp4-a.port: .*'base_port' is undefined"):
        listen(spec, layout_for({}), a)


def test_the_launch_check_parses_each_instances_own_argv(tmp_path: Path) -> None:
    """What SGLang's parser is given per instance: the base args with the instance's overrides,
    rendered for this host, and its own port (an override's flag is checked, not only the base's)."""
    from fleetctl.release.launch_check import server_argv

    spec = load_spec(pair(tmp_path))
    layout = layout_for({"tp_size": 8, "base_port": 30001, "dist_init_addr": "10.0.0.1:5000"})
    a, b = instances.of_spec(spec)
    assert server_argv(spec, layout, b) == ["--model-path", "/m", "--dist-init-addr", "10.0.0.1:5000", "--tp", "4",
                                            "--enable-metrics", "--host", "127.0.0.1", "--port", "30002"]
    assert server_argv(spec, layout, a)[-6:] == ["--tp", "4", "--host", "127.0.0.1", "--port", "30001"]


def test_single_instance_spec_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "one.yml"
    path.write_text('name: one\nversion: "1"\nbase: {adopt: /v}\nservice: {args: [--tp, "8"]}\n')
    spec = load_spec(path)
    (only,) = instances.of_spec(spec)
    assert (only.name, only.unit_name, only.params_name) == (None, "sglang", "service.json")
    assert instances.release_record(spec) is None and instances.names_of({"port": 30000}) == [None]


def test_units_verify_with_systemd_and_are_enabled(tmp_path: Path) -> None:
    """Each instance's unit as systemd itself reads it (its ExecStart must exist: a release root under
    tmp_path), with Restart=on-failure and User=; installed with the link ``systemctl enable`` makes."""
    root = tmp_path / "opt"
    (root / "current" / "venv" / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", root / "current" / "venv" / "bin" / "python")
    spec = load_spec(pair(tmp_path))
    layout = layout_for({"fleetctl_root": str(root), "tp_size": 8, "base_port": 30001, "dist_init_addr": "h:1"})
    loader = importlib.util.spec_from_file_location("systemd_units", REMOTE / "systemd_units.py")
    assert loader is not None and loader.loader is not None
    units = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(units)
    folder = tmp_path / "etc" / "systemd" / "system"
    folder.mkdir(parents=True)
    for inst in instances.of_spec(spec):
        text = unit(spec, layout, inst)
        assert "Restart=on-failure\n" in text and "User=daemon\n" in text
        assert f"EnvironmentFile={root}/current/{inst.env_name}\n" in text
        name = f"{inst.unit_name}.service"
        paths = units.install_unit(str(folder), name, text)
        verify = subprocess.run(["systemd-analyze", "verify", paths["unit_file"]], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr
        link = folder / "multi-user.target.wants" / name
        assert os.readlink(link) == str(folder / name)
        assert "WantedBy=multi-user.target" in (folder / name).read_text()


def test_batches_never_split_a_multi_node_group() -> None:
    group = {"n1": "g1", "n2": "g1", "solo": None, "m1": "g2", "m2": "g2"}.get
    assert batches(["n1", "solo", "n2", "m1", "m2"], [1], group) == [["n1", "n2"], ["solo"], ["m1", "m2"]]
    assert batches(["n1", "n2", "m1", "m2"], ["50%"], group) == [["n1", "n2"], ["m1", "m2"]]


def test_node_group_vars_from_the_groups_first_host() -> None:
    from fleetctl.release.nodegroups import node_vars

    hosts = {"a1": {"mn": "g", "service_host": "10.0.0.1"}, "x": {}, "a2": {"mn": "g"},
             "b1": {"mn": "h", "ansible_host": "10.0.1.1", "dist_init_port": 7000}}
    assert node_vars(hosts, "mn") == {
        "a1": {"nnodes": 2, "node_rank": 0, "dist_init_addr": "10.0.0.1:20000"},
        "a2": {"nnodes": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:20000"},
        "b1": {"nnodes": 1, "node_rank": 0, "dist_init_addr": "10.0.1.1:7000"}}
