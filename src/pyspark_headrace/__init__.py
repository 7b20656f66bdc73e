"""Static registration of the ``headrace`` PySpark data source.

pyspark looks up every top-level module named ``pyspark_*`` on the Python path
and registers its ``DefaultSource`` under the source's ``name()``; with this
module installed, ``spark.read.format("headrace")`` needs no register call.
"""

from headrace.spark.source import HeadraceDataSource

DefaultSource = HeadraceDataSource

__all__ = ["DefaultSource"]
