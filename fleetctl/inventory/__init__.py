"""Ansible inventories: YAML, INI, directories, executable scripts, host lists, several at once.

Each source format has its module (yaml_source, ini_source, script_source; sources.py decides
which reads what, as ansible-core's InventoryManager); all of them add to one RawInventory,
and build.py merges variables in one place (merge_vars). The semantics follow ansible-core
2.19, checked against real Ansible by tests/test_inventory_ansible.py. Stricter than Ansible
where Ansible only warns: unknown keys, malformed groups and bad ranges are errors naming
file:line.
"""

from fleetctl.connection import ConnectionSpec
from fleetctl.inventory.build import VarLayer, merge_vars
from fleetctl.inventory.model import Group, Host, Inventory
from fleetctl.inventory.sources import env_sources, load_inventory
from fleetctl.inventory.yaml_source import SECTIONS

__all__ = ["SECTIONS", "ConnectionSpec", "Group", "Host", "Inventory", "VarLayer", "env_sources",
           "load_inventory", "merge_vars"]
