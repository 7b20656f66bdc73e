"""The PySpark data source and sink ``headrace`` (extra ``[spark]``).

Once the package is installed, ``spark.read.format("headrace")`` works with no
register call: pyspark registers the ``DefaultSource`` of every top-level
``pyspark_*`` module it finds, and ``pyspark_headrace`` is ours.
:func:`register` does the same by hand (for a session whose Python path
lacks the package). pyspark is imported only in this package, and only when a
data source class is used (``import headrace.spark`` alone does not need it).
See ``docs/spark.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .options import OptionError, ReadOptions, WriteOptions, read_options, write_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "OptionError",
    "ReadOptions",
    "WriteOptions",
    "read_options",
    "register",
    "write_options",
]


def register(spark: SparkSession) -> None:
    """Register the ``headrace`` data source with ``spark`` by hand."""
    from .source import HeadraceDataSource

    spark.dataSource.register(HeadraceDataSource)
