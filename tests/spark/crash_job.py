"""A user's Spark job for the crash tests: copy stream queue `in` to address `out`.

    python tests/spark/crash_job.py URL CHECKPOINT [--per-trigger N] [--per-partition N]

A streaming query (Trigger.AvailableNow, the `scow` source and sink, a checkpoint) run as
its own process, as a user runs one; exit status 0 once it has caught up, 1 if the query
failed (the broker went away under it), as a job's would.

With SCOW_CRASH_AT set, micro-batch SCOW_CRASH_BATCH stops at that point and waits to be
killed (or, for a broker's kill, to be released), after creating `<point>` in
SCOW_CRASH_DIR so that the test knows where it stands:

- `read`: a read task has handed Spark its first rows of the batch;
- `write`: a write task has sent the broker its first rows of the batch (staged);
- `staged`: every task staged its rows; the driver's commit has not begun;
- `committed`: the broker committed the batch; Spark's commit log does not have it yet.

The hooks run where Spark runs that code (read and write in executor workers, the commit
in the driver's commit runner): each is a subclass of the connector's own classes.
A file `release` in SCOW_CRASH_DIR lets a stopped batch go on.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

POINT = os.environ.get("SCOW_CRASH_AT", "")
BATCH = int(os.environ.get("SCOW_CRASH_BATCH", "1"))
DIRECTORY = Path(os.environ.get("SCOW_CRASH_DIR", "."))


def stop_here(point: str, batch: int | None) -> None:
    """At the configured point of the configured batch: say so, then wait for release."""
    if point != POINT or batch != BATCH:
        return
    (DIRECTORY / point).touch()
    while not (DIRECTORY / "release").exists():  # a kill ends this; a release lets it go
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("checkpoint")
    parser.add_argument("--per-trigger", default="100")
    parser.add_argument("--per-partition", default="50")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from scow.plugins.spark.source import (
        ScowDataSource,
        ScowStreamReader,
        ScowStreamWriter,
        _task,
    )

    class Reader(ScowStreamReader):
        def read(self, partition: Any) -> Iterator[Any]:
            first = True
            for batch in super().read(partition):
                yield batch
                if first:  # Spark has the first rows and asks for more
                    stop_here("read", _task().batch)
                first = False

    class Writer(ScowStreamWriter):
        def write(self, iterator: Iterator[Any]) -> Any:
            task = _task()

            def rows() -> Iterator[Any]:
                for number, batch in enumerate(iterator):
                    if number == 1:  # the first rows went out
                        stop_here("write", task.batch)
                    yield batch

            return super().write(rows())

        def commit(self, messages: list[Any], batchId: int) -> None:
            stop_here("staged", batchId)
            super().commit(messages, batchId)
            stop_here("committed", batchId)

    class Source(ScowDataSource):
        def streamReader(self, schema: Any) -> Reader:
            return Reader(self.parsed)

        def streamWriter(self, schema: Any, overwrite: bool) -> Writer:
            super().streamWriter(schema, overwrite)  # its checks
            return Writer(self.parsed)

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("scow-crash-job")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # several record batches per task, so that a batch can stop between two
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(Source)
    query = (
        spark.readStream.format("scow")
        .option("url", args.url)
        .option("queues", "in")
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", args.per_trigger)
        .option("maxMessagesPerPartition", args.per_partition)
        .option("timeout", "5")
        .load()
        .select("body")
        .writeStream.format("scow")
        .option("url", args.url)
        .option("address", "out")
        .option("timeout", "5")
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    except Exception as exc:  # the query failed: a job's exit status says so
        print(f"query failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
