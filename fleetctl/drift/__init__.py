"""Drift audits: what each host runs, against a golden host or a lock, and the reports of it."""
