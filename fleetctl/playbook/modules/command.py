"""Playbook module(s): command."""
