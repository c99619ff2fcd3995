"""PLACEHOLDER: replaced by the runtime-probe work (import, http, script)."""

import click


@click.command(name="import")
def import_() -> None:
    """(not built yet)"""


@click.command()
def http() -> None:
    """(not built yet)"""


@click.command()
def script() -> None:
    """(not built yet)"""
