"""PLACEHOLDER: replaced by the venv work (create, overlay)."""

import click


@click.group()
def venv() -> None:
    """(not built yet)"""
