"""fleetctl: run a fleet of GPU inference hosts serving a patched SGLang."""

__version__ = "0.1.0"
