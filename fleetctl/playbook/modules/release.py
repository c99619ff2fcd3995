"""Playbook module(s): release."""
