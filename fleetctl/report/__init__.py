"""``fleetctl report``: the fleet at a glance, gathered in one read-only pass."""
