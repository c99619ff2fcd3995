"""Every host variable fleetctl reads, in one table: its type, default and meaning.

The reference page (docs/reference/host-variables.md) is generated from it, and a test reads the
package for host-variable reads and fails on one this table does not name. Variables a release spec
or playbook templates (``tp_size``, ``HF_TOKEN``, ...) are the user's own, and not listed here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostVar:
    name: str
    type: str
    default: str
    meaning: str
    section: str
    aliases: tuple[str, ...] = ()


CONNECTION, PATHS, SERVICE, GPU, OTHER = "Connection", "Host paths", "Service", "GPU health", "Venvs, kernels, secrets"
SECTIONS = (CONNECTION, PATHS, SERVICE, GPU, OTHER)

HOST_VARS: tuple[HostVar, ...] = (
    HostVar("ansible_connection", "`ssh` or `local`", "`ssh`", "How the host is reached; `local` runs on the "
            "controller without SSH (no become).", CONNECTION),
    HostVar("ansible_host", "string", "the inventory name", "Address or ssh_config alias to connect to.",
            CONNECTION, ("ansible_ssh_host",)),
    HostVar("ansible_port", "integer", "ssh_config's `Port`, else 22", "SSH port.", CONNECTION,
            ("ansible_ssh_port",)),
    HostVar("ansible_user", "string", "`-u`, else ssh_config's `User`, else the local user", "Login user.",
            CONNECTION, ("ansible_ssh_user",)),
    HostVar("ansible_ssh_private_key_file", "path", "`--private-key`, then ssh_config's `IdentityFile`",
            "Key file tried first (relative to the inventory file).", CONNECTION, ("ansible_private_key_file",)),
    HostVar("ansible_ssh_private_key_passphrase", "string (secret)", "unset",
            "Passphrase of an encrypted key not in ssh-agent.", CONNECTION),
    HostVar("ansible_password", "string (secret)", "unset", "Login password, where the server allows one.",
            CONNECTION, ("ansible_ssh_pass", "ansible_ssh_password")),
    HostVar("ansible_python_interpreter", "path", "the host's `venv` python, else `python3`",
            "Interpreter of the agent fleetctl starts on the host.", CONNECTION),
    HostVar("ansible_timeout", "seconds", "10",
            "Connect timeout (TCP connect, SSH banner, key exchange and login, each).", CONNECTION,
            ("ansible_ssh_timeout",)),
    HostVar("ansible_ssh_common_args", "string", "unset", "`-J`/`-o ProxyJump=`/`-o ProxyCommand=` (bastions) "
            "and `-o ServerAliveInterval=`/`ServerAliveCountMax=`; other options are named as ignored.",
            CONNECTION),
    HostVar("ansible_ssh_extra_args", "string", "unset", "As `ansible_ssh_common_args`, read after it.",
            CONNECTION),
    HostVar("jump_host", "string", "unset", "Bastion, or a comma list for a chain (`a,b`); an inventory host "
            "name uses that host's settings.", CONNECTION),
    HostVar("ansible_become", "boolean", "`-b`, else false", "Run the agent under sudo.", CONNECTION),
    HostVar("ansible_become_user", "string", "`--become-user`, else root", "The user sudo runs as.", CONNECTION),
    HostVar("ansible_become_method", "`sudo`", "`sudo`", "Only sudo is implemented; anything else is refused.",
            CONNECTION),
    HostVar("ansible_become_password", "string (secret)", "`-K`, else none (sudo -n)", "sudo password, given on "
            "sudo's stdin after its prompt.", CONNECTION, ("ansible_become_pass",)),
    HostVar("ansible_host_key_checking", "boolean", "true", "Only `true` is accepted: host keys are always "
            "checked.", CONNECTION, ("ansible_ssh_host_key_checking",)),
    HostVar("ansible_ssh_pipelining", "boolean", "unset", "Accepted and ignored: fleetctl always sends its "
            "work over one agent channel.", CONNECTION, ("ansible_pipelining",)),
    HostVar("ansible_group_priority", "integer", "1", "Group vars merge order among sibling groups, as Ansible.",
            CONNECTION),
    HostVar("fleetctl_known_hosts", "path", "`known_hosts` beside the inventory, else `~/.ssh/known_hosts`",
            "The known_hosts file host keys are checked against and pinned into.", CONNECTION),
    HostVar("fleetctl_root", "path (template)", "`/opt/fleetctl`", "Releases, bases and the `current` link.",
            PATHS),
    HostVar("fleetctl_state_dir", "path (template)", "`/var/lib/fleetctl`", "state.json, the deploy lock, the "
            "service's pid and log, overlay journals and manifests, the wheelhouse, hash caches.", PATHS),
    HostVar("fleetctl_wheelhouse", "path", "`<fleetctl_state_dir>/wheelhouse`", "Where `venv create` keeps "
            "wheels on the host; a folder that already holds them (a machine-wide cache) saves the upload.", PATHS),
    HostVar("service_host", "string (template)", "`127.0.0.1` (the spec's `service.host`)", "Address the server "
            "listens on and the gates, probes and warm-up call.", SERVICE),
    HostVar("service_port", "integer (template)", "the spec's `service.port`", "Port of the server (a single "
            "server; instances have their own).", SERVICE),
    HostVar("service_manager", "`systemd` or `process`", "detected on the host", "systemd units or fleetctl's "
            "supervisor.", SERVICE),
    HostVar("dist_init_port", "integer", "20000", "Port of `dist_init_addr` for multi-node servers "
            "(`service.node_group`), read from the group's first host.", SERVICE),
    HostVar("nnodes", "integer", "set by fleetctl", "A multi-node server's node count (`service.node_group`); "
            "fleetctl sets it per host, with `node_rank` and `dist_init_addr`.", SERVICE),
    HostVar("dist_init_addr", "host:port", "set by fleetctl", "A multi-node server's rendezvous address: the "
            "group's first host (`service_host`, else `ansible_host`, else its name) at `dist_init_port`.", SERVICE),
    HostVar("node_rank", "integer", "set by fleetctl", "The host's rank in its multi-node server (inventory order): "
            "a rank > 0 serves SGLang's health server only, so it is gated on its health endpoint and probes, "
            "and is no gateway worker.", SERVICE),
    HostVar("router_url", "URL or list of URLs", "unset", "The SGLang Model Gateway(s) in front of this host's "
            "servers: every change takes its workers out first and adds them back once gated.", SERVICE),
    HostVar("router_worker_host", "string", "`ansible_host`, else the inventory name", "The address the gateway "
            "reaches this host's servers at (the worker URL `http://ADDRESS:PORT`).", SERVICE),
    HostVar("router_drain_timeout", "seconds", "300", "How long a drain waits for 0 requests in flight before "
            "the host fails (server untouched, worker out).", SERVICE),
    HostVar("router_add_timeout", "seconds", "120", "How long a worker added back may take to be healthy in the "
            "gateway.", SERVICE),
    HostVar("gpus_expected", "integer", "unset: not checked", "GPUs the host must have (`gpu_count` red "
            "otherwise).", GPU, ("gpus_per_host",)),
    HostVar("gpu_model", "regex", "unset: not checked", "Every GPU's name must match it (`H200`).", GPU),
    HostVar("gpu_ecc_correctable_max", "integer", "1000", "Correctable ECC errors before amber.", GPU),
    HostVar("gpu_retired_pages_max", "integer", "10", "Retired pages before amber.", GPU),
    HostVar("gpu_temp_margin_min", "integer (C)", "5", "Degrees to the slowdown temperature before amber.", GPU),
    HostVar("gpu_pcie_width_min", "integer", "8", "PCIe lanes below which the link is red.", GPU),
    HostVar("gpu_pcie_gen_min", "integer", "3", "PCIe generation below which a GPU in P0/P1 is red.", GPU),
    HostVar("gpu_nvlink_errors_max", "integer", "100", "Error counts of one NVLink link before amber.", GPU),
    HostVar("gpu_xid_since", "Unix time or ISO date", "unset: this boot", "Older Xids are not new (after a "
            "reset, say).", GPU),
    HostVar("gpu_xid_ignore", "list of integers", "`[]`", "Xid numbers never counted.", GPU),
    HostVar("gpu_nvlink_expected", "boolean", "from the GPU model (HGX/DGX SXM boards: true)", "Every GPU pair "
            "must be joined by NVLink in `topo -m` (`topology` red otherwise).", GPU),
    HostVar("gpu_nvlink_per_pair", "integer", "the host's most common count", "NVLinks each GPU pair must have "
            "(`NV18` on HGX H100/H200).", GPU),
    HostVar("gpu_processes_allowed", "list of globs", "`[]`", "Process names that may hold a GPU besides the "
            "release's server (`dcgm*`, `sglang::*`).", GPU),
    HostVar("gpu_foreign_processes", "`amber` or `red`", "`amber`", "The level of a GPU held by another "
            "process.", GPU),
    HostVar("gpu_mig_expected", "boolean", "false", "MIG mode every GPU must be in (`mig` red otherwise).", GPU),
    HostVar("nvidia_smi", "path", "`nvidia-smi` on PATH", "The nvidia-smi binary (facts, drift, kernels, GPU "
            "health).", GPU),
    HostVar("venv", "path", "unset", "The host's ML venv: what drift, probes, facts and report read by default.",
            OTHER),
    HostVar("direct_ssh_key", "path on the target", "the target's own keys", "Key the target uses to pull from "
            "the source in `venv overlay --direct`.", OTHER),
    HostVar("hf_token", "string (vault-encrypted)", "unset", "Hugging Face token `models sync --hf-download` "
            "gives `hf download` on this seed host, in its environment; a plain-text value is refused.", OTHER),
    HostVar("gpu_name", "string", "nvidia-smi's name", "GPU name for tuned kernel configs where nvidia-smi "
            "gives none.", OTHER),
    HostVar("triton_version", "string", "the venv's triton", "Triton version for tuned kernel configs where "
            "triton is not installed.", OTHER),
    HostVar("secret_vars", "list of variable names", "`[]`", "Variables whose values are masked in output, "
            "`--json`, diffs and journals.", OTHER),
)


def documented_names() -> set[str]:
    """Every name and alias in the table."""
    return {n for v in HOST_VARS for n in (v.name, *v.aliases)}
