"""`format("scow")` with no registration: Spark's lookup of Python data sources.

At the first data source call of a session, Spark runs
`pyspark.sql.worker.lookup_data_sources` in a Python worker: it imports every top-level
module named `pyspark_*` that `pkgutil.iter_modules()` lists and registers its
`DefaultSource` (a `DataSource` subclass) under `DefaultSource.name()`. Installing
`scow[spark]` puts this package there; `spark.dataSource.register(ScowDataSource)` keeps
working and registers the same class.
"""

try:
    from scow.plugins.spark.source import ScowDataSource
except ModuleNotFoundError as missing:  # pragma: no cover - scow without its spark extra
    # the lookup imports every pyspark_* module and one failing import fails every Python
    # data source of the session: without pyarrow, offer nothing rather than break theirs
    if missing.name != "pyarrow":
        raise
else:
    DefaultSource = ScowDataSource
