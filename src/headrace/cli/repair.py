"""``headrace repair DATA_DIR``: cut a damaged write-ahead log so the store opens again."""

from __future__ import annotations

from pathlib import Path

import click

from headrace.errors import HeadraceError

__all__ = ["repair"]


@click.command()
@click.argument(
    "data_dir", type=click.Path(exists=True, file_okay=False, dir_okay=True, path_type=Path)
)
def repair(data_dir: Path) -> None:
    """Cut the write-ahead log of DATA_DIR where the server refuses to open it.

    Only for damage `headrace serve` refuses (it says so, and `headrace
    verify` reports it): the log is cut at the first damaged record, what is
    cut off is copied to `.broken-*` files beside it, and every cut is
    reported with the records it held. Those records are lost. Run it while
    the server is stopped. Exits with status 1 if damage outside the log is
    left (nothing is changed for it).
    """
    from headrace.store.disk.repair import repair_data_dir

    try:
        report = repair_data_dir(data_dir)
    except (HeadraceError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    for line in report.lines():
        click.echo(line)
    if not report.ok:
        raise SystemExit(1)
