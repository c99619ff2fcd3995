"""Releases: spec, patches, host layout, service, health gates."""
