"""Spark connector figures: reading a stream queue through the `scow` data source.

Starts `scow run` (file journal, spark plugin, a stream queue `bench` and a standard queue
`base`) as a subprocess, fills both with --count non-durable --size messages (`scow perf
client --mode send`), then measures, on one local[2] SparkSession started beforehand (its
JVM start is not timed; a 1,000-message read warms it up):

1. the broker's own rate: `scow perf client --mode receive` draining `base` (baseline);
2. the connector's client alone (no Spark): one reader over the whole stream;
3. a Spark batch read of the whole stream (`sum(length(body))`, so every row is built),
   split into --partitions partitions;
4. a streaming read, maxMessagesPerTrigger 100k, Trigger.AvailableNow, to a noop sink;
5. a Spark batch write of --write-count rows of --size bytes to a second stream.

Prints each rate (median of --runs for 2-4) and its ratio to the baseline.

    .venv/bin/python benchmarks/spark_bench.py               # 1 M x 100 B
    .venv/bin/python benchmarks/spark_bench.py --quick       # 100 k
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from paging_bench import Broker, backlog_client
from run_perf import platform_line

PLUGINS = '"amqp", "file-journal", "standard-queues", "full-policies", "paging", "spark"'
QUEUES = """\
[queues."bench"]
routing-type = "ANYCAST"
durable = true
arguments = { "x-queue-type" = "stream", "segment-bytes" = 67108864 }

[queues."written"]
routing-type = "ANYCAST"
arguments = { "x-queue-type" = "stream" }

[queues."base"]
routing-type = "ANYCAST"
durable = false
"""


def timed(action) -> float:  # type: ignore[no-untyped-def]
    begin = time.perf_counter()
    action()
    return time.perf_counter() - begin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--write-count", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="counts / 10")
    args = parser.parse_args()
    if args.quick:
        args.count //= 10
        args.write_count //= 10
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from scow.plugins.spark.client import Client, Endpoint
    from scow.plugins.spark.source import ScowDataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ScowDataSource)
    with tempfile.TemporaryDirectory(prefix="scow-spark-bench-") as tmp:
        root = Path(tmp)
        broker = Broker(root / "broker", plugins=PLUGINS, extra=QUEUES)
        broker.start()
        try:
            fill = backlog_client(f"{broker.url}/bench", "send", args)
            backlog_client(f"{broker.url}/base", "send", args)
            client = Client(Endpoint.parse(broker.url, timeout=600))
            while client.call("stream", "bench", "READ")["next-sequence"] < args.count:
                time.sleep(0.1)
            baseline = backlog_client(f"{broker.url}/base", "receive", args)["receive_rate"]

            def read_client() -> None:
                got = sum(len(b) for b in client.read("bench", 0, args.count))
                assert got == args.count, got

            def reader(**options: str):  # type: ignore[no-untyped-def]
                df = spark.read.format("scow").option("url", broker.url).option("queues", "bench")
                for key, value in options.items():
                    df = df.option(key, value)
                return df.load()

            reader(endingOffsets='{"bench": 1000}').agg(F.sum(F.length("body"))).collect()

            def read_spark() -> None:
                df = reader(minPartitions=str(args.partitions))
                rows = df.agg(F.count("*"), F.sum(F.length("body"))).collect()[0]
                assert rows[0] == args.count, rows

            def read_stream() -> None:
                checkpoint = root / f"checkpoint-{time.monotonic_ns()}"
                query = (
                    spark.readStream.format("scow")
                    .option("url", broker.url)
                    .option("queues", "bench")
                    .option("startingOffsets", "earliest")
                    .option("maxMessagesPerTrigger", "100000")
                    .load()
                    .writeStream.format("noop")
                    .option("checkpointLocation", str(checkpoint))
                    .trigger(availableNow=True)
                    .start()
                )
                query.awaitTermination()
                rows = sum(p["numInputRows"] for p in query.recentProgress)
                assert rows == args.count, rows

            client_s = [timed(read_client) for _ in range(args.runs)]
            spark_s = [timed(read_spark) for _ in range(args.runs)]
            stream_s = [timed(read_stream) for _ in range(args.runs)]
            body = "x" * args.size
            to_write = spark.range(args.write_count).select(
                F.lit(body).cast("binary").alias("body")
            )
            to_write = to_write.repartition(args.partitions).cache()
            to_write.count()
            write_s = timed(
                lambda: (
                    to_write.write.format("scow")
                    .option("url", broker.url)
                    .option("address", "written")
                    .mode("append")
                    .save()
                )
            )
            client.close()
        finally:
            broker.stop()
    spark.stop()
    rate = lambda seconds: args.count / statistics.median(seconds)  # noqa: E731
    print(f"scow Spark connector, {args.count:,} x {args.size} B, local[2], {platform_line()}")
    print(f"  fill (scow perf client --mode send)    {fill['send_rate']:>10,.0f} msg/s")
    print(f"  baseline: scow perf client receive      {baseline:>10,.0f} msg/s   1.00")
    for name, seconds in (
        ("connector client alone (1 reader)", client_s),
        (f"Spark batch read ({args.partitions} partitions)", spark_s),
        ("Spark streaming read (100k/trigger)", stream_s),
    ):
        print(f"  {name:38} {rate(seconds):>10,.0f} msg/s   {rate(seconds) / baseline:.2f}")
    write_rate = args.write_count / write_s
    print(
        f"  Spark batch write ({args.write_count:,} rows)     {write_rate:>10,.0f} msg/s   "
        f"{write_rate / baseline:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
