"""``headrace verify DATA_DIR``: check every checksum of a data dir, offline."""

from __future__ import annotations

from pathlib import Path

import click

from headrace.store.disk.verify import verify_data_dir

__all__ = ["verify"]


@click.command()
@click.argument(
    "data_dir", type=click.Path(exists=True, file_okay=False, dir_okay=True, path_type=Path)
)
def verify(data_dir: Path) -> None:
    """Check DATA_DIR (manifest, snapshots, WAL records, data against sidecars)
    without modifying it. Exits with status 1 if anything is damaged."""
    report = verify_data_dir(data_dir)
    for line in report.lines():
        click.echo(line)
    if not report.ok:
        raise SystemExit(1)
