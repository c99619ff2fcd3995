"""PLACEHOLDER: replaced by the source-probe work (grep, symbol)."""

import click


@click.command()
def grep() -> None:
    """(not built yet)"""


@click.command()
def symbol() -> None:
    """(not built yet)"""
