"""Playbook module(s): service."""
