"""The ``headrace`` command. The only place that configures logging or reads the terminal."""

from __future__ import annotations

import logging

import click

from headrace import __version__
from headrace.cli.demo import demo
from headrace.cli.serve import serve
from headrace.cli.verify import verify

__all__ = ["main"]


@click.group()
@click.version_option(__version__, prog_name="headrace")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """headrace: a durable streaming storage service."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


main.add_command(serve)
main.add_command(demo)
main.add_command(verify)
