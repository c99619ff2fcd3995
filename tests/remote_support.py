"""Host-side modules loaded in the test process as the agent ships them: the module's text with
its ``# fleetctl-include`` modules before it (``module_source``), run as one module."""

from __future__ import annotations

from types import ModuleType

from fleetctl.transport.agent import REMOTE_DIR, module_source


def remote_module(name: str) -> ModuleType:
    """``fleetctl/remote/<name>.py`` with its includes, as a module (``__file__`` its own file)."""
    module = ModuleType(f"fleetctl_remote_{name}")
    module.__file__ = str(REMOTE_DIR / f"{name}.py")
    exec(compile(module_source(name)[0], module.__file__, "exec"), module.__dict__)  # noqa: S102 - our own module
    return module
