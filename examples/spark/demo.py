"""A Spark pipeline on Scow, in one command: `make spark-demo` (or `python examples/spark/demo.py`).

1. Starts a broker (in this process) with the spark plugin, its data under
   `./data/spark-demo/broker`, and a stream queue `orders`.
2. Publishes orders (JSON bodies: customer, amount) to it.
3. Runs a streaming query with its checkpoint under `./data/spark-demo/checkpoint`: it
   reads `orders` (at most 2,000 messages per micro-batch, Trigger.AvailableNow), sums
   the amounts per customer in each micro-batch and writes those totals to the stream
   `totals` exactly once (the write commits as the micro-batch's id of a sink: a
   replayed micro-batch is not written twice).
4. Reads `totals` back with a batch query and prints the total per customer next to the
   totals computed directly from what was sent.

Run it again: the checkpoint resumes where the last run ended, so only the new orders are
read and the totals keep adding up (remove ./data/spark-demo to start over).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors import scow too

from scow.core.testing import BrokerThread, broker_config, write_config
from scow.plugins.spark.client import Client, Endpoint
from scow.protocols.amqp.codec import encode_message

ROOT = Path("data/spark-demo")
ORDERS = 4000
CUSTOMERS = ("ada", "brian", "chen", "dana", "eve")
ORDER = "customer STRING, amount DOUBLE"
PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "paging", "spark"]
STREAMS = {
    name: {"address": name, "routing-type": "ANYCAST", "arguments": {"x-queue-type": "stream"}}
    for name in ("orders", "totals")
}


def start_broker() -> BrokerThread:
    ROOT.mkdir(parents=True, exist_ok=True)
    sections = {"queues": STREAMS, "broker": {"log-level": "warning"}}
    config = broker_config(ROOT / "broker", plugins=PLUGINS, sections=sections)
    return BrokerThread(write_config(ROOT / "scow.toml", config)).start()


def orders_of(seed: int) -> tuple[list[bytes], dict[str, float]]:
    """Run `seed`'s orders as messages, and their total per customer."""
    rng = random.Random(seed)
    sent: dict[str, float] = defaultdict(float)
    orders = []
    for _ in range(ORDERS):
        customer = rng.choice(CUSTOMERS)
        amount = round(rng.uniform(1, 100), 2)
        sent[customer] += amount
        body = json.dumps({"customer": customer, "amount": amount})
        orders.append(encode_message(body, durable=True))
    return orders, sent


def publish(url: str, seed: int) -> dict[str, float]:
    orders, sent = orders_of(seed)
    client = Client(Endpoint.parse(url))
    try:
        client.send("orders", orders)
    finally:
        client.close()
    return sent


def run_pipeline(url: str) -> tuple[int, dict[str, tuple[float, int]]]:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    from scow.plugins.spark.source import ScowDataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("scow-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ScowDataSource)
    orders = (
        spark.readStream.format("scow")
        .option("url", url)
        .option("queues", "orders")
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "2000")
        .option("cursor", "demo")
        .load()
        .select(F.from_json(F.col("body").cast("string"), ORDER).alias("o"))
    )

    def write_totals(batch: DataFrame, batch_id: int) -> None:
        """This batch's total per customer, written to `totals` as batch `batch_id` of
        sink `demo-totals`: a replayed batch id is ignored by the broker."""
        (
            batch.groupBy("o.customer")
            .agg(F.round(F.sum("o.amount"), 2).alias("total"), F.count("*").alias("orders"))
            .select(F.to_json(F.struct("customer", "total", "orders")).alias("body"))
            .write.format("scow")
            .option("url", url)
            .option("address", "totals")
            .option("sinkId", "demo-totals")
            .option("batchId", str(batch_id))
            .mode("append")
            .save()
        )

    query = (
        orders.writeStream.foreachBatch(write_totals)
        .option("checkpointLocation", str(ROOT / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = len([p for p in query.recentProgress if p["numInputRows"]])
    totals = (
        spark.read.format("scow")
        .option("url", url)
        .option("queues", "totals")
        .load()
        .select(
            "sequence",
            F.from_json(
                F.col("body").cast("string"), "customer STRING, total DOUBLE, orders LONG"
            ).alias("t"),
        )
        .collect()
    )
    latest: dict[str, tuple[float, int]] = defaultdict(lambda: (0.0, 0))
    for row in totals:  # one row per customer per micro-batch: add them up
        total, count = latest[row.t.customer]
        latest[row.t.customer] = (total + row.t.total, count + row.t.orders)
    spark.stop()
    return batches, latest


def main() -> int:
    broker = start_broker()
    try:
        url = broker.url
        client = Client(Endpoint.parse(url))
        runs = int(client.call("stream", "orders", "READ")["next-sequence"]) // ORDERS
        client.close()
        sent: dict[str, float] = defaultdict(float)
        for seed in range(runs):  # earlier runs sent these (the same seeds give the same)
            for customer, amount in orders_of(seed)[1].items():
                sent[customer] += amount
        for customer, amount in publish(url, runs).items():
            sent[customer] += amount
        print(f"published {ORDERS} orders to stream 'orders' (run {runs + 1})")
        started = time.monotonic()
        batches, latest = run_pipeline(url)
        print(
            f"streaming query: {batches} micro-batches in {time.monotonic() - started:.1f} s "
            f"(checkpoint {ROOT / 'checkpoint'})"
        )
        print(f"{'customer':10} {'total (stream)':>15} {'orders':>7} {'total (sent)':>13}")
        ok = True
        for customer in CUSTOMERS:
            total, count = latest.get(customer, (0.0, 0))
            expected = round(sent[customer], 2)
            ok &= abs(total - expected) < 0.01 * max(1, count)
            print(f"{customer:10} {total:15.2f} {count:7d} {expected:13.2f}")
        print("totals match what was sent: exactly once" if ok else "MISMATCH")
        return 0 if ok else 1
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
