"""GPU facts, health rules and the health report, from nvidia-smi's outputs."""
