"""Spark connector figures: reading and writing stream queues through the `scow` source.

Starts two `scow run` brokers as subprocesses (file journal, spark plugin, a stream queue
`bench` and a standard queue `base` on each), fills `bench` on both and `base` on the
first with --count non-durable --size messages (`scow perf client --mode send`), then
measures, on one local[2] SparkSession started beforehand (its JVM start is not timed; a
1,000-message read warms it up, and a 1,000-row write the write path before the batch
write):

1. the broker's own rate: `scow perf client --mode receive` draining `base` (baseline);
2. the connector's client alone (no Spark): one reader over the whole stream;
3. a Spark batch read of the whole stream of one broker (`sum(length(body))`, so every
   row is built), split into --partitions partitions;
4. a streaming read of one broker, maxMessagesPerTrigger 100k, Trigger.AvailableNow, to a
   noop sink;
5. a Spark batch read of both brokers' streams (`url` listing both: 2 x --count rows),
   with its ratio to the one-broker read (goal: 1.5 or more), taking turns with 3; the
   machine's busy CPU per message of each (every process's, from /proc/stat) gives the
   ratio's ceiling on this machine: its cores over what a two-broker read costs, against
   the one-broker rate;
6. a Spark batch write of --write-count rows of --size bytes to a stream (staged, then
   committed);
7. a streaming write: the first broker's whole stream copied by a streaming query (100k
   per trigger, AvailableNow) to another stream through the exactly-once sink (the rate
   counts the read as well).

Prints each rate (median of --runs for 2-5) and its ratio to the baseline.

`--codec` measures instead, with no broker and no Spark, the connector's conversions alone:
record batches built from --count stream records by the fast path (plain records) and by
the general one, and messages encoded from body-only rows by the fast path and by the
general one (a null `subject` column beside the body), alternating, median of --runs.

    .venv/bin/python benchmarks/spark_bench.py               # 1 M x 100 B
    .venv/bin/python benchmarks/spark_bench.py --quick       # 100 k
    .venv/bin/python benchmarks/spark_bench.py --codec --count 100000 --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

[queues."copied"]
routing-type = "ANYCAST"
arguments = { "x-queue-type" = "stream" }

[queues."base"]
routing-type = "ANYCAST"
durable = false
"""


def timed(action: Callable[[], Any]) -> float:
    begin = time.perf_counter()
    action()
    return time.perf_counter() - begin


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (not idle nor waiting for I/O) since
    boot, from /proc/stat: every process counts (brokers, the JVM, Spark's workers)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def timed_busy(action: Callable[[], Any], spent: list[float]) -> float:
    """`timed(action)`, appending to `spent` the machine's busy CPU seconds meanwhile."""
    before = busy_seconds()
    seconds = timed(action)
    spent.append(busy_seconds() - before)
    return seconds


def codec_rates(args: argparse.Namespace) -> None:
    """The conversions alone, fast path against general path, alternating."""
    import pyarrow as pa

    from scow.plugins.spark import schema
    from scow.plugins.spark.records import annotate
    from scow.protocols.amqp.codec import encode_message

    n, body = args.count, b"x" * args.size
    records = [annotate(encode_message(body), i, 1_700_000_000_000 + i) for i in range(n)]
    rounds = [records[s : s + 5000] for s in range(0, n, 5000)]
    rows = pa.RecordBatch.from_arrays([pa.array([body] * n)], ["body"])
    with_subject = rows.append_column("subject", pa.nulls(n, pa.string()))
    cases: dict[str, Callable[[], Any]] = {
        "to_batch, general path": lambda: [schema._any_batch("q", r) for r in rounds],
        "to_batch, plain records": lambda: [schema.to_batch("q", r) for r in rounds],
        "messages_of, general path": lambda: list(schema.messages_of(with_subject, "s:1:0:")),
        "messages_of, body only": lambda: list(schema.messages_of(rows, "s:1:0:")),
    }
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, case in cases.items():
            seconds[name].append(timed(case))
    print(f"scow Spark connector conversions, {n:,} x {args.size} B, {platform_line()}")
    for name, taken in seconds.items():
        print(f"  {name:28} {n / statistics.median(taken):>10,.0f} rows/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--write-count", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="counts / 10")
    parser.add_argument("--codec", action="store_true", help="the conversions alone")
    args = parser.parse_args()
    if args.codec:
        codec_rates(args)
        return 0
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
    # an editable install's pyspark_scow is not found by Spark's lookup (see the README)
    spark.dataSource.register(ScowDataSource)
    with tempfile.TemporaryDirectory(prefix="scow-spark-bench-") as tmp:
        root = Path(tmp)
        brokers = [Broker(root / f"broker-{i}", plugins=PLUGINS, extra=QUEUES) for i in (1, 2)]
        for broker in brokers:
            broker.start()
        first = brokers[0]
        both = ",".join(b.url for b in brokers)
        try:
            fill = backlog_client(f"{first.url}/bench", "send", args)
            backlog_client(f"{brokers[1].url}/bench", "send", args)
            backlog_client(f"{first.url}/base", "send", args)
            client = Client(Endpoint.parse(first.url, timeout=600))
            for broker in brokers:
                counter = Client(Endpoint.parse(broker.url, timeout=600))
                while counter.call("stream", "bench", "READ")["next-sequence"] < args.count:
                    time.sleep(0.1)
                counter.close()
            baseline = backlog_client(f"{first.url}/base", "receive", args)["receive_rate"]

            def read_client() -> None:
                got = sum(len(b) for b in client.read("bench", 0, args.count))
                assert got == args.count, got

            def reader(url: str, **options: str) -> Any:
                df = spark.read.format("scow").option("url", url).option("queues", "bench")
                for key, value in options.items():
                    df = df.option(key, value)
                return df.load()

            reader(first.url, endingOffsets='{"bench": 1000}').agg(
                F.sum(F.length("body"))
            ).collect()

            def read_spark(url: str, expected: int) -> Callable[[], None]:
                def run() -> None:
                    df = reader(url, minPartitions=str(args.partitions))
                    rows = df.agg(F.count("*"), F.sum(F.length("body"))).collect()[0]
                    assert rows[0] == expected, rows

                return run

            def stream_to(sink: Callable[[Any], Any], name: str) -> int:
                """Run a streaming read of the first broker's whole stream into `sink`
                (AvailableNow); the rows it read."""
                checkpoint = root / f"checkpoint-{name}-{time.monotonic_ns()}"
                df = (
                    spark.readStream.format("scow")
                    .option("url", first.url)
                    .option("queues", "bench")
                    .option("startingOffsets", "earliest")
                    .option("maxMessagesPerTrigger", "100000")
                    .load()
                )
                writer = sink(df).option("checkpointLocation", str(checkpoint))
                query = writer.trigger(availableNow=True).start()
                query.awaitTermination()
                return int(sum(p["numInputRows"] for p in query.recentProgress))

            def read_stream() -> None:
                rows = stream_to(lambda df: df.writeStream.format("noop"), "noop")
                assert rows == args.count, rows

            client_s = [timed(read_client) for _ in range(args.runs)]
            one_cpu: list[float] = []
            both_cpu: list[float] = []
            spark_s, both_s = [], []
            for _ in range(args.runs):  # in turns: the machine's load weighs on both alike
                spark_s.append(timed_busy(read_spark(first.url, args.count), one_cpu))
                both_s.append(timed_busy(read_spark(both, 2 * args.count), both_cpu))
            stream_s = [timed(read_stream) for _ in range(args.runs)]
            body = "x" * args.size
            to_write = spark.range(args.write_count).select(
                F.lit(body).cast("binary").alias("body")
            )
            to_write = to_write.repartition(args.partitions).cache()
            to_write.count()

            def write(rows: Any) -> None:
                rows.write.format("scow").option("url", first.url).option(
                    "address", "written"
                ).mode("append").save()

            write(to_write.limit(1000))  # warms the write path up, as the read above
            write_s = timed(lambda: write(to_write))
            copy_rows = 0

            def copy() -> None:
                nonlocal copy_rows
                copy_rows = stream_to(
                    lambda df: (
                        df.select("body")
                        .writeStream.format("scow")
                        .option("url", first.url)
                        .option("address", "copied")
                    ),
                    "copy",
                )

            copy_s = timed(copy)
            client.close()
        finally:
            for broker in brokers:
                if broker.proc is not None:
                    broker.proc.terminate()
                    broker.proc.wait(30)
    spark.stop()

    def rate(seconds: list[float], count: int = args.count) -> float:
        return count / statistics.median(seconds)

    one = rate(spark_s)
    print(f"scow Spark connector, {args.count:,} x {args.size} B, local[2], {platform_line()}")
    print(f"  fill (scow perf client --mode send)    {fill['send_rate']:>10,.0f} msg/s")
    print(f"  baseline: scow perf client receive      {baseline:>10,.0f} msg/s   1.00")
    for name, value in (
        ("connector client alone (1 reader)", rate(client_s)),
        (f"Spark batch read ({args.partitions} partitions)", one),
        ("Spark streaming read (100k/trigger)", rate(stream_s)),
        ("Spark batch read, two brokers", rate(both_s, 2 * args.count)),
        (f"Spark batch write ({args.write_count:,} rows)", args.write_count / write_s),
        (f"Spark streaming copy ({copy_rows:,} rows)", copy_rows / copy_s),
    ):
        print(f"  {name:38} {value:>10,.0f} msg/s   {value / baseline:.2f}")
    print(f"  two brokers / one broker (batch read)  {rate(both_s, 2 * args.count) / one:.2f}")
    # what the ratio can reach here: both reads share this machine's cores, so two
    # brokers read at most (cores / CPU per message of the two-broker read) messages a second
    cores = os.cpu_count() or 1
    one_us = statistics.median(one_cpu) / args.count * 1e6
    both_us = statistics.median(both_cpu) / (2 * args.count) * 1e6
    busy = statistics.median(c / s for c, s in zip(one_cpu, spark_s, strict=True))
    print(
        f"  batch reads' machine CPU: one broker {one_us:.2f} us/msg ({busy:.2f} of "
        f"{cores} cores busy), two brokers {both_us:.2f} us/msg"
    )
    print(f"  ceiling of two / one on {cores} cores      {cores / (both_us * 1e-6) / one:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
