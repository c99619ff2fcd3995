"""Playbook module(s): drift (being written)."""
