"""Playbooks: plays of tasks run over the fleet in serial batches, with failure budgets,
automatic rollback and a JSON-lines journal (``fleetctl run``)."""
