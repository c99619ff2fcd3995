"""Playbook module(s): probe (being written)."""
