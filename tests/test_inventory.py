"""The inventory loader: format, ranges, vars files, precedence, patterns, connections, errors.

tests/test_inventory_ansible.py checks the same behaviour against real Ansible.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from fleetctl.errors import InventoryError, PatternError
from fleetctl.inventory import ConnectionSpec, Inventory, VarLayer, load_inventory, merge_vars
from fleetctl.patterns import expand_host_range, split_host_port, split_pattern

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "inventory"
REPO = Path(__file__).resolve().parents[1]


def make(tmp_path: Path, files: dict[str, str], extra_vars: dict[str, object] | None = None) -> Inventory:
    """Write an inventory ('hosts.yml' plus group_vars/host_vars files) and load it."""
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return load_inventory(tmp_path / "hosts.yml", extra_vars)


def var(inv: Inventory, host: str, name: str = "x") -> object:
    return inv.hosts[host].vars.get(name)


# --- host ranges ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("ct129", ["ct129"]),
        ("ct[129:131]", ["ct129", "ct130", "ct131"]),
        ("gpu[01:03]", ["gpu01", "gpu02", "gpu03"]),
        ("gpu[08:10]", ["gpu08", "gpu09", "gpu10"]),
        ("n[a:c]", ["na", "nb", "nc"]),
        ("n[y:B]", ["ny", "nz", "nA", "nB"]),  # Ansible's order: a-z then A-Z
        ("x[1:10:3]", ["x1", "x4", "x7", "x10"]),
        ("x[a:e:2]", ["xa", "xc", "xe"]),
        ("x[:2]", ["x0", "x1", "x2"]),  # an empty begin is 0
        ("[1:2]-node", ["1-node", "2-node"]),
        ("r[1:2]-[a:b].dc", ["r1-a.dc", "r1-b.dc", "r2-a.dc", "r2-b.dc"]),
    ],
)
def test_expand_host_range(key: str, expected: list[str]) -> None:
    assert expand_host_range(key) == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("ct129", ("ct129", None)),
        ("ct129:2222", ("ct129", 2222)),
        ("10.0.0.1:22", ("10.0.0.1", 22)),
        ("ct[1:3]:2200", ("ct[1:3]", 2200)),
        ("[::1]:2222", ("::1", 2222)),
        ("fe80::1", ("fe80::1", None)),
        ("ct[1:3]", ("ct[1:3]", None)),
    ],
)
def test_split_host_port(key: str, expected: tuple[str, int | None]) -> None:
    assert split_host_port(key) == expected


def test_ranges_and_ports_in_inventory(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": """
        all:
          hosts:
            "mgmt[1:2]:2200":
            "ipmi[1:2]:2200":
              ansible_port: 2201
            gpu[01:08]:
    """})
    assert list(inv.hosts) == ["mgmt1", "mgmt2", "ipmi1", "ipmi2"] + [f"gpu0{i}" for i in range(1, 9)]
    assert inv.hosts["mgmt2"].connection.port == 2200
    assert inv.hosts["ipmi1"].vars["ansible_port"] == 2201  # inline vars beat the key's :port
    assert inv.hosts["gpu08"].connection.port is None  # unset: ssh_config decides, else 22


# --- structure -----------------------------------------------------------------------------

NESTED = """
    all:
      hosts:
        bastion:
      children:
        gpu:
          children:
            h200:
              hosts:
                ct[129:131]:
              children:
                canary:
                  hosts:
                    ct129:
            blackwell:
              hosts:
                gpu[01:02]:
        storage:
          hosts:
            ct131:
    rack2:
      hosts: gpu02
      children: storage
"""


def test_nesting_and_groups(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": NESTED})
    assert inv.hosts["ct129"].groups == ("canary", "gpu", "h200")
    assert inv.hosts["ct131"].groups == ("gpu", "h200", "rack2", "storage")  # one host, many groups
    assert inv.hosts["gpu02"].groups == ("blackwell", "gpu", "rack2")
    assert inv.groups["h200"].parents == ("gpu",)
    assert inv.groups["h200"].children == ("canary",)
    assert inv.groups["h200"].hosts == ("ct129", "ct130", "ct131")
    assert inv.groups["storage"].parents == ("all", "rack2")
    assert inv.groups["rack2"].parents == ("all",)  # a top-level group other than all
    assert (inv.groups["gpu"].depth, inv.groups["canary"].depth, inv.groups["storage"].depth) == (1, 3, 2)
    assert inv.group_hosts("gpu") == ["ct129", "ct130", "ct131", "gpu01", "gpu02"]
    assert inv.group_names() == ["blackwell", "canary", "gpu", "h200", "rack2", "storage", "ungrouped"]
    assert inv.path == tmp_path / "hosts.yml"


def test_ungrouped_like_ansible(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": """
        all:
          hosts:
            lone:
            ct129:
          children:
            gpu:
              hosts:
                ct129:
        ungrouped:
          hosts:
            lone2:
            ct130:
        other:
          hosts:
            ct130:
    """})
    assert inv.groups["ungrouped"].hosts == ("lone2", "lone")
    assert inv.hosts["lone"].groups == ("ungrouped",)
    assert inv.hosts["ct130"].groups == ("other",)  # listed under ungrouped but also grouped
    assert "ungrouped" in inv.group_names()


def test_empty_ungrouped_is_not_listed(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": "gpu:\n  hosts:\n    ct129:\n"})
    assert inv.group_names() == ["gpu"]
    assert set(inv.groups) == {"all", "ungrouped", "gpu"}


def test_empty_sections_and_groups(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": """
        all:
          vars:
          children:
            empty:
            gpu:
              hosts:
                ct129:
              children:
    """})
    assert inv.groups["empty"].hosts == ()
    assert list(inv.hosts) == ["ct129"]


def test_host_to_dict(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": "gpu:\n  vars: {venv: /root/ml-env}\n  hosts:\n    ct129:\n"})
    host = inv.hosts["ct129"]
    assert host.to_dict() == {"name": "ct129", "groups": ["gpu"], "vars": {"venv": "/root/ml-env"}}
    assert {host, host} == {host}


def test_unsafe_tag_is_a_plain_string(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": "all:\n  vars:\n    motd: !unsafe '{{ not a template }}'\n  hosts:\n    a:\n"})
    assert var(inv, "a", "motd") == "{{ not a template }}"


# --- group_vars / host_vars files ----------------------------------------------------------

FLAT = "all:\n  children:\n    gpu:\n      hosts:\n        ct129:\n"


@pytest.mark.parametrize("name", ["gpu", "gpu.yml", "gpu.yaml", "gpu.json"])
def test_group_vars_file_names(tmp_path: Path, name: str) -> None:
    inv = make(tmp_path, {"hosts.yml": FLAT, f"group_vars/{name}": '{"x": "file"}\n'})
    assert var(inv, "ct129") == "file"


def test_first_vars_file_found_wins(tmp_path: Path) -> None:
    # Ansible looks for NAME, NAME.yml, NAME.yaml, NAME.json and uses only the first it finds.
    inv = make(tmp_path, {"hosts.yml": FLAT, "group_vars/gpu.yml": "x: yml\ny: yml\n",
                          "group_vars/gpu.yaml": "x: yaml\nz: yaml\n"})
    assert (var(inv, "ct129"), var(inv, "ct129", "z")) == ("yml", None)


def test_vars_folders_merge_sorted_and_recursive(tmp_path: Path) -> None:
    inv = make(tmp_path, {
        "hosts.yml": FLAT,
        "group_vars/gpu/10.yml": "x: ten\na: 1\n",
        "group_vars/gpu/20.yaml": "x: twenty\n",
        "group_vars/gpu/30/inner.yml": "x: inner\nb: 2\n",
        "group_vars/gpu/.hidden.yml": "x: hidden\n",
        "group_vars/gpu/99.yml~": "x: backup\n",
        "group_vars/gpu/notes.txt": "x: txt\n",
        "group_vars/gpu/empty.yml": "# nothing\n",
        "host_vars/ct129/a.yml": "h: a\n",
        "host_vars/ct129/b": "h: b\n",
    })
    assert {k: var(inv, "ct129", k) for k in "xabh"} == {"x": "inner", "a": 1, "b": 2, "h": "b"}
    assert inv.groups["gpu"].vars == {"x": "inner", "a": 1, "b": 2}


def test_vars_files_for_unknown_names_are_ignored(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": FLAT, "group_vars/nogroup.yml": "x: 1\n", "host_vars/nohost.yml": "x: 1\n"})
    assert var(inv, "ct129") is None


def test_group_vars_all_and_ungrouped(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": "all:\n  hosts:\n    lone:\n", "group_vars/all.yml": "x: all\n",
                          "group_vars/ungrouped.yml": "y: ungrouped\n"})
    assert (var(inv, "lone"), var(inv, "lone", "y")) == ("all", "ungrouped")


# --- precedence: one test per rung, lowest first -------------------------------------------

THREE_LEVELS = """
    all:
      vars: {x: all-inline}
      children:
        gpu:
          vars: {x: gpu-inline}
          children:
            h200:
              vars: {x: h200-inline}
              hosts:
                ct129: {x: host-inline}
                ct130:
            blackwell:
              hosts:
                gpu01:
"""


def test_rung_group_beats_all(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": THREE_LEVELS})
    assert var(inv, "gpu01") == "gpu-inline"


def test_rung_child_group_beats_parent(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": THREE_LEVELS})
    assert var(inv, "ct130") == "h200-inline"


def test_rung_host_inline_beats_groups(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": THREE_LEVELS})
    assert var(inv, "ct129") == "host-inline"


SIBLINGS = """
    beta:
      vars: {x: beta}
      hosts: {h: }
    alpha:
      vars: {x: alpha}
      hosts: {h: }
"""


def test_rung_same_depth_merges_alphabetically(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": SIBLINGS})
    assert var(inv, "h") == "beta"  # alpha, then beta over it: file order does not matter


def test_rung_group_priority_orders_same_depth(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": SIBLINGS.replace("{x: alpha}", "{x: alpha, ansible_group_priority: 10}")})
    assert var(inv, "h") == "alpha"
    assert "ansible_group_priority" not in inv.hosts["h"].vars  # Ansible consumes it
    assert inv.groups["alpha"].priority == 10


def test_rung_depth_beats_priority(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": """
        gpu:
          vars: {x: gpu, ansible_group_priority: 99}
          children:
            h200:
              vars: {x: h200}
              hosts: {h: }
    """})
    assert var(inv, "h") == "h200"


def test_rung_group_file_beats_same_group_inline(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": THREE_LEVELS, "group_vars/blackwell.yml": "x: blackwell-file\n",
                          "group_vars/gpu.yml": "x: gpu-file\n"})
    assert var(inv, "gpu01") == "blackwell-file"


def test_rung_all_file_beats_all_inline(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": "all:\n  vars: {x: inline}\n  hosts: {h: }\n",
                          "group_vars/all.yml": "x: file\n"})
    assert var(inv, "h") == "file"


def test_rung_all_file_beats_child_inline(tmp_path: Path) -> None:
    # Ansible's VARIABLE_PRECEDENCE: every inline group var < group_vars/all < group_vars/GROUP.
    inv = make(tmp_path, {"hosts.yml": THREE_LEVELS, "group_vars/all.yml": "x: all-file\n"})
    assert var(inv, "ct130") == "all-file"


def test_rung_parent_file_beats_child_inline(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": THREE_LEVELS, "group_vars/gpu.yml": "x: gpu-file\n"})
    assert var(inv, "ct130") == "gpu-file"


def test_rung_child_file_beats_parent_file(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": THREE_LEVELS, "group_vars/gpu.yml": "x: gpu-file\n",
                          "group_vars/h200.yml": "x: h200-file\n", "group_vars/all.yml": "x: all-file\n"})
    assert var(inv, "ct130") == "h200-file"


def test_rung_host_inline_beats_group_files(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": THREE_LEVELS, "group_vars/h200.yml": "x: h200-file\n"})
    assert var(inv, "ct129") == "host-inline"


def test_rung_host_file_beats_host_inline(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": THREE_LEVELS, "host_vars/ct129.yml": "x: host-file\n"})
    assert var(inv, "ct129") == "host-file"


def test_rung_extra_vars_beat_everything(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": THREE_LEVELS, "host_vars/ct129.yml": "x: host-file\n"},
               extra_vars={"x": "extra", "ansible_user": "deploy"})
    assert {var(inv, h) for h in inv.hosts} == {"extra"}
    assert inv.hosts["ct129"].connection.user == "deploy"
    assert inv.groups["h200"].vars == {"x": "h200-inline"}  # group vars are not host vars


def test_hash_behaviour_replace(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": """
        all:
          vars: {x: {a: 1, b: 2}}
          hosts:
            h: {x: {a: 10}}
    """})
    assert var(inv, "h") == {"a": 10}  # replaced whole, not deep-merged


def test_later_definition_wins_within_the_file(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": """
        one:
          vars: {x: first, y: first}
          hosts:
            h: {x: first, y: first}
        two:
          hosts:
            h: {x: second}
          children:
            one:
              vars: {x: second}
    """})
    assert (var(inv, "h"), var(inv, "h", "y")) == ("second", "first")
    assert inv.groups["one"].vars == {"x": "second", "y": "first"}


def test_merge_vars_order_directly() -> None:
    layers = [
        VarLayer("h200", 2, 1, {"x": "h200-inline", "i": 1}, {"f": "h200-file"}),
        VarLayer("all", 0, 1, {"x": "all-inline", "i": 0, "f": "x"}, {"x": "all-file", "f": "all-file"}),
        VarLayer("gpu", 1, 1, {"x": "gpu-inline"}, {"f": "gpu-file"}),
        VarLayer("alpha", 2, 1, {"i": "alpha"}, {}),
    ]
    merged = merge_vars(layers, {"h": "inline"}, {"h": "file"}, {"e": 1})
    assert merged == {"x": "all-file", "i": 1, "f": "h200-file", "h": "file", "e": 1}
    assert merge_vars([], {}, {}, None) == {}


# --- patterns ------------------------------------------------------------------------------


@pytest.fixture
def fleet(tmp_path: Path) -> Inventory:
    return make(tmp_path, {"hosts.yml": NESTED})


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (None, "bastion ct129 ct130 ct131 gpu01 gpu02"),
        ("", "bastion ct129 ct130 ct131 gpu01 gpu02"),
        ("all", "bastion ct129 ct130 ct131 gpu01 gpu02"),
        ("*", "bastion ct129 ct130 ct131 gpu01 gpu02"),
        ("ct1*", "ct129 ct130 ct131"),
        ("ct13?", "ct130 ct131"),
        ("gpu0[!1]", "gpu02"),
        ("gpu*", "ct129 ct130 ct131 gpu01 gpu02"),  # matches group gpu and hosts gpu01, gpu02
        ("~ct13[01]", "ct130 ct131"),
        ("~13", None),  # re.match: anchored at the start, as in Ansible
        ("~.*13", "ct130 ct131"),
        ("h200:blackwell", "ct129 ct130 ct131 gpu01 gpu02"),
        ("gpu:&rack2", "ct131 gpu02"),
        ("gpu:!h200", "gpu01 gpu02"),
        ("!h200:gpu", "gpu01 gpu02"),  # exclusions apply last, wherever they are written
        ("&rack2:gpu:!storage", "gpu02"),
        ("!gpu", "bastion"),  # only exclusions: start from all
        ("&rack2", "ct131 gpu02"),
        ("h200,blackwell", "ct129 ct130 ct131 gpu01 gpu02"),
        (" canary , gpu01 ", "ct129 gpu01"),
        ("gpu,!h200", "gpu01 gpu02"),
        ("canary", "ct129"),
        ("ungrouped", "bastion"),
        ("ct130", "ct130"),
        ("ct130:ct131", "ct130 ct131"),
        ("h200[0]", "ct129"),
        ("h200[1:2]", "ct130 ct131"),
        ("h200[-1]", "ct131"),
        ("h200[1:]", "ct130 ct131"),
        ("gpu[0:1]", "ct129 ct130"),
        ("al*", "bastion ct129 ct130 ct131 gpu01 gpu02"),  # 'all' is matched by globs too
    ],
)
def test_select(fleet: Inventory, pattern: str | None, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(PatternError):
            fleet.select(pattern)
    else:
        assert [h.name for h in fleet.select(pattern)] == expected.split()


def test_select_returns_hosts_sorted(fleet: Inventory) -> None:
    hosts = fleet.select("gpu01,ct129,gpu01")
    assert [h.name for h in hosts] == ["ct129", "gpu01"]
    assert hosts[0] is fleet.hosts["ct129"]


def test_no_match_lists_groups(fleet: Inventory) -> None:
    with pytest.raises(PatternError) as info:
        fleet.select("xyz")
    assert str(info.value) == "no hosts match 'xyz'; groups: blackwell, canary, gpu, h200, rack2, storage"


def test_typo_in_a_compound_pattern_is_an_error(fleet: Inventory) -> None:
    # Ansible only warns and goes on; for a rollout tool 'gpu:!ct13O' must not mean 'gpu'.
    with pytest.raises(PatternError, match=r"^no hosts match 'ct13O' \(in 'gpu:!ct13O'\); groups: "):
        fleet.select("gpu:!ct13O")


def test_empty_intersection_is_an_error(fleet: Inventory) -> None:
    with pytest.raises(PatternError, match=r"^no hosts match 'canary:&blackwell'; groups: "):
        fleet.select("canary:&blackwell")


def test_digits_in_brackets_are_a_subscript_like_ansible(fleet: Inventory) -> None:
    with pytest.raises(PatternError, match=r"Ansible reads '\[1-2\]' as a subscript"):
        fleet.select("gpu0[1-2]")


def test_subscript_out_of_range(fleet: Inventory) -> None:
    with pytest.raises(PatternError, match="subscripted pattern 'h200\\[5\\]'"):
        fleet.select("h200[5]")


def test_bad_regex(fleet: Inventory) -> None:
    with pytest.raises(PatternError, match=r"^invalid host pattern '~ct\(': "):
        fleet.select("~ct(")


@pytest.mark.parametrize(
    ("pattern", "parts"),
    [
        ("a:b", ["a", "b"]),
        ("a:&b:!c", ["a", "&b", "!c"]),
        ("a,b:c", ["a", "b:c"]),  # with commas, colons are not separators
        ("ct[1:3]:gpu", ["ct[1:3]", "gpu"]),
        ("host:22", ["host:22"]),  # reads as an address, stays whole (as in Ansible)
        ("fe80::1", ["fe80::1"]),
        (" a , ,b ", ["a", "b"]),
    ],
)
def test_split_pattern(pattern: str, parts: list[str]) -> None:
    assert split_pattern(pattern) == parts


# --- connection settings -------------------------------------------------------------------


def conn(tmp_path: Path, host_vars: str) -> ConnectionSpec:
    body = textwrap.indent(textwrap.dedent(host_vars), "      ")
    inv = make(tmp_path, {"hosts.yml": "all:\n  hosts:\n    h1:\n" + body})
    return inv.hosts["h1"].connection


def test_connection_defaults(tmp_path: Path) -> None:
    assert conn(tmp_path, "") == ConnectionSpec(kind="ssh", hostname="h1", port=None, user=None, key_file=None,
                                                python=None, jump=None, known_hosts=None, connect_timeout=10.0,
                                                venv=None)


def test_connection_all_fields(tmp_path: Path) -> None:
    spec = conn(tmp_path, """
        ansible_host: 10.0.0.5
        ansible_port: "2222"
        ansible_user: root
        ansible_ssh_private_key_file: keys/id_ed25519
        ansible_python_interpreter: /usr/bin/python3.11
        fleetctl_known_hosts: known_hosts
        ansible_timeout: "5.5"
        venv: /root/ml-env
        jump_host: ops@bastion:2200
    """)
    assert spec == ConnectionSpec(
        kind="ssh", hostname="10.0.0.5", port=2222, user="root",
        key_file=str(tmp_path.absolute() / "keys/id_ed25519"), python="/usr/bin/python3.11",
        jump="ops@bastion:2200", known_hosts=str(tmp_path.absolute() / "known_hosts"),
        connect_timeout=5.5, venv="/root/ml-env",
    )


def test_key_file_tilde_and_absolute(tmp_path: Path) -> None:
    assert conn(tmp_path, "ansible_ssh_private_key_file: ~/.ssh/id_rsa").key_file == os.path.expanduser(
        "~/.ssh/id_rsa")
    assert conn(tmp_path, "ansible_ssh_private_key_file: /etc/k").key_file == "/etc/k"


@pytest.mark.parametrize(
    ("value", "kind"),
    [("ssh", "ssh"), ("smart", "ssh"), ("paramiko", "ssh"), ("local", "local"), ("ansible.builtin.local", "local")],
)
def test_connection_kinds(tmp_path: Path, value: str, kind: str) -> None:
    assert conn(tmp_path, f"ansible_connection: {value}").kind == kind


@pytest.mark.parametrize(
    ("args", "jump"),
    [
        ("-J bastion", "bastion"),
        ("-Jops@bastion:2200", "ops@bastion:2200"),
        ("-o ProxyJump=ops@bastion", "ops@bastion"),
        ("-oProxyJump=bastion:2222", "bastion:2222"),
        ("-o ProxyJump bastion", "bastion"),
        ("-o 'ProxyJump bastion'", "bastion"),
        ("-o StrictHostKeyChecking=no -o proxyjump=bastion", "bastion"),
        ("-o ProxyJump=none", None),
        ("-o ServerAliveInterval=30", None),
    ],
)
def test_jump_from_ssh_common_args(tmp_path: Path, args: str, jump: str | None) -> None:
    assert conn(tmp_path, f'ansible_ssh_common_args: "{args}"').jump == jump


def test_jump_from_extra_args_and_jump_host_wins(tmp_path: Path) -> None:
    assert conn(tmp_path, 'ansible_ssh_extra_args: "-J b2"').jump == "b2"
    assert conn(tmp_path, 'jump_host: b1\nansible_ssh_common_args: "-J b2"').jump == "b1"


# --- errors --------------------------------------------------------------------------------


def _bad_cases() -> list[Path]:
    bad = FIXTURES / "bad"
    return sorted(bad.glob("*.yml")) + sorted(bad.glob("*/hosts.yml"))


@pytest.mark.parametrize("path", _bad_cases(), ids=lambda p: str(p.relative_to(FIXTURES / "bad")))
def test_malformed_inventory(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file's first line says the exact one-line error it must produce."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: ")
    relative = path.relative_to(FIXTURES)
    expected = first.removeprefix("# expect: ").replace("{path}", str(relative))
    expected = expected.replace("{dir}", str(relative.parent))
    monkeypatch.chdir(FIXTURES)
    with pytest.raises(InventoryError) as info:
        load_inventory(relative)
    assert str(info.value) == expected
    assert "\n" not in str(info.value)


def test_missing_inventory(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=f"^{tmp_path}/nope.yml: inventory file not found$"):
        load_inventory(tmp_path / "nope.yml")


def test_empty_directory_is_no_inventory(tmp_path: Path) -> None:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "notes.md").write_text("# ignored, as Ansible ignores it\n")
    with pytest.raises(InventoryError, match=f"^{tmp_path}: no inventory file in this directory"):
        load_inventory(tmp_path)


# --- the example inventory and speed -------------------------------------------------------


def test_example_inventory() -> None:
    inv = load_inventory(REPO / "inventory" / "example.yml")
    assert [h.name for h in inv.select("h200")] == ["ct129", "ct130", "ct131"]
    assert len(inv.select("blackwell")) == 8
    assert [h.name for h in inv.select("gpu:&rack_b:!blackwell")] == ["ct131"]
    ct129 = inv.hosts["ct129"]
    assert ct129.vars["service_port"] == 30001  # host_vars/ct129.yml
    assert ct129.connection == ConnectionSpec(kind="ssh", hostname="10.20.0.129", user="root",
                                              python="/usr/bin/python3", jump="bastion",
                                              connect_timeout=20.0, venv="/root/ml-env")
    assert inv.hosts["gpu05"].vars["cuda_version"] == "12.8"
    assert inv.hosts["bastion"].connection.venv is None


def test_large_inventory_loads(tmp_path: Path) -> None:
    """2,000 hosts from ranges; how fast is bench/inventory_load.py's business (a timed assert flakes)."""
    racks = "\n".join(f"    rack{r}:\n      hosts:\n        r{r}n[001:100]:" for r in range(20))
    (tmp_path / "hosts.yml").write_text(f"all:\n  vars: {{venv: /root/ml-env}}\n  children:\n{racks}\n")
    inv = load_inventory(tmp_path / "hosts.yml")
    assert len(inv.select("rack1*:!rack10")) == 1000
    assert len(inv.hosts) == 2000


# --- INI, scripts, directories, several sources (tests/test_inventory_ansible.py: same as Ansible) --


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[gpu]\nct1 x\n", "hosts.ini:2: expected key=value host variable, got 'x'"),
        ("[gpu:hosts2]\n", "hosts.ini:1: section [gpu:hosts2] has unknown type 'hosts2' (expected vars or children)"),
        ("[gpu name]\n", "hosts.ini:1: invalid section '[gpu name]' (no spaces or other characters allowed in "
                         "'[group]', '[group:vars]', '[group:children]')"),
        ("[gpu:vars]\nx=1\n", "hosts.ini:1: section [gpu:vars] is for a group defined nowhere in the file"),
        ("[a:children]\nb\n", "hosts.ini:2: section [a:children] names group 'b', defined nowhere in the file "
                              "(give it a [section] of its own)"),
        ("[a]\n[a:vars]\nnovalue\n", "hosts.ini:3: expected key=value in [a:vars], got 'novalue'"),
        ("[a]\nh ansible_colour=red\n", "hosts.ini:2: host 'h': ansible_colour is not a connection variable "
                                        "fleetctl implements (see the host variables reference); remove or rename it"),
        ("[a]\n[a:vars]\nansible_colour=red\n",
         "hosts.ini:3: group 'a': ansible_colour is not a connection variable fleetctl implements "
         "(see the host variables reference); remove or rename it"),
        ("[a]\nct[3:1]\n", "hosts.ini:2: host range '[3:1]' must have begin <= end"),
        ("[a]\nh x='unclosed\n", "hosts.ini:2: cannot split host line like a shell line: No closing quotation"),
        ("[a]\nh:\n", "hosts.ini:2: host 'h:' ends in ':' (reserved for a port)"),
        ("[a:children]\nb\n[b:children]\na\n", "hosts.ini:4: group 'a' under 'b' makes a loop ('b' is inside it)"),
        ("[a]\nh\n[a:vars]\nansible_group_priority=high\n",
         "hosts.ini:4: ansible_group_priority of group 'a' must be an integer, got 'high'"),
        ("[a]\nh ansible_port=99999\n", "hosts.ini: host 'h': ansible_port must be a port number 1-65535, got 99999"),
    ],
)
def test_ini_errors_name_file_and_line(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "hosts.ini").write_text(text)
    with pytest.raises(InventoryError) as info:
        load_inventory(tmp_path / "hosts.ini")
    assert str(info.value) == f"{tmp_path}/{expected}"


def test_ini_without_extension_and_yaml_without_extension(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "hosts").write_text("[gpu]\nct1 x=1\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "hosts").write_text("all:\n  hosts:\n    ct2: {x: 2}\n")
    inv = load_inventory([str(tmp_path / "a" / "hosts"), str(tmp_path / "b" / "hosts")])
    assert {h.name: h.vars["x"] for h in inv.hosts.values()} == {"ct1": 1, "ct2": 2}
    assert inv.sources == (tmp_path / "a" / "hosts", tmp_path / "b" / "hosts")


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "inv.py"
    path.write_text(f"#!{os.sys.executable}\nimport json, sys\n{textwrap.dedent(body)}")  # type: ignore[attr-defined]
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("sys.exit('cloud API says no')\n", "inv.py --list: inventory script exited 1: cloud API says no"),
        ("print('not json')\n", "inv.py --list: inventory script output is not JSON (line 1: "),
        ("print('[]')\n", "inv.py --list: inventory script must print a JSON object, got a list"),
        ("print(json.dumps({'g': {'hosts': 'h1'}}))\n", "inv.py --list: 'g.hosts' must be a list, got a string"),
        ("print(json.dumps({'g': {'hosts': ['h'], 'vars': {'ansible_colour': 1}}}))\n",
         "inv.py --list: group 'g': ansible_colour is not a connection variable"),
        ("print(json.dumps({'g': ['h'], '_meta': {'hostvars': {'h': {'ansible_colour': 1}}}}))\n",
         "inv.py --list: _meta.hostvars: host 'h': ansible_colour is not a connection variable"),
    ],
)
def test_script_errors_are_one_line(tmp_path: Path, body: str, expected: str) -> None:
    script = _script(tmp_path, body)
    with pytest.raises(InventoryError) as info:
        load_inventory(script)
    assert str(info.value).startswith(f"{tmp_path}/{expected}")
    assert "\n" not in str(info.value)


def test_limit_file(tmp_path: Path) -> None:
    inv = make(tmp_path, {"hosts.yml": "all:\n  hosts:\n    a:\n    b:\n    c:\n", "limit": "a\n\nc\n!c\n"})
    assert [h.name for h in inv.select(f"@{tmp_path}/limit")] == ["a"]
    with pytest.raises(PatternError, match="^limit file .*/nope: not found$"):
        inv.select(f"@{tmp_path}/nope")
