"""Playbook module(s): files (being written)."""
