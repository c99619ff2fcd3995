"""Playbook module(s): venv (being written)."""
