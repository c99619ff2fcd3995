"""Playbook module(s): kernels (being written)."""
