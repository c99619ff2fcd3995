"""Every playbook module, registered in ``base.MODULES`` by importing its file."""

from fleetctl.playbook.modules import (  # noqa: F401  (imported to register the modules)
    asyncjobs,
    command,
    drift,
    files,
    gpu_health,
    hostfiles,
    hostget,
    kernels,
    net,
    pause,
    probe,
    release,
    service,
    system,
    variables,
    venv,
)
from fleetctl.playbook.modules.base import MODULES, Module, ModuleContext, RunServices, TaskResult

__all__ = ["MODULES", "Module", "ModuleContext", "RunServices", "TaskResult"]
