"""Tuned fused-MoE Triton kernel configs: ``configs`` (SGLang's naming, validation, lookup, the merged folder),
``plan`` (which file each host gets), ``collect`` (a host's tuning output brought home)."""

from fleetctl.kernels.collect import Collected, CollectItem, fetch_tuning_output, plan_collect, write_collected
from fleetctl.kernels.configs import (
    ENV_VAR,
    LAUNCH_KEYS,
    ConfigName,
    KernelConfigError,
    TunedFile,
    TunedSet,
    folder_version,
    load_tuned,
    merged_folder,
    parse_config_name,
    sglang_lookup,
    triton_folder,
    validate_config,
)
from fleetctl.kernels.plan import (
    KernelHost,
    KernelPlan,
    PlanEntry,
    gather,
    plan_host,
    resolve_gpu,
    resolve_triton,
    sibling_names,
)

__all__ = [
    "ENV_VAR", "LAUNCH_KEYS", "Collected", "CollectItem", "ConfigName", "KernelConfigError", "KernelHost",
    "KernelPlan", "PlanEntry", "TunedFile", "TunedSet", "fetch_tuning_output", "folder_version", "gather",
    "load_tuned", "merged_folder", "parse_config_name", "plan_collect", "plan_host", "resolve_gpu",
    "resolve_triton", "sglang_lookup", "sibling_names", "triton_folder", "validate_config", "write_collected",
]
