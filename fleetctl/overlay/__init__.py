"""``fleetctl venv overlay``: bringing one host's distributions into other hosts' venvs."""
