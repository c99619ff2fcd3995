"""Models on the fleet: the spec's models, their manifests, verification tiers, status and removal.

The host half lives in fleetctl/remote/model_*.py (stdlib only); this package decides and interprets."""
