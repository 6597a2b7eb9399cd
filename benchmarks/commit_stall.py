"""A large transaction's commit and everyone else: how long the broker's loop stalls.

Starts `scow run` (file journal, spark plugin, a stream queue `out`) as a subprocess,
stages --count rows of --size bytes for a sink the way a Spark task does (in packs, no
Spark: `scow.plugins.spark.source.stage`), then commits them (`source.commit`: COMMIT,
then READ until the batch is durable) while a second connection keeps asking the broker
a small question (a sink's READ) in a loop. Prints, per run:

- the commit's wall time (COMMIT sent to batch durable) and the broker's CPU during it
  per row (from /proc: user + system);
- the other connection's round trips during the commit: how many, the median, and the
  longest (the loop's longest stall, plus one round trip).

    .venv/bin/python benchmarks/commit_stall.py                      # 250,000 rows, 3 runs
    .venv/bin/python benchmarks/commit_stall.py --count 50000 --runs 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from paging_bench import Broker
from run_perf import platform_line

PLUGINS = '"amqp", "file-journal", "standard-queues", "full-policies", "paging", "spark"'
QUEUES = """\
[queues."out"]
routing-type = "ANYCAST"
arguments = { "x-queue-type" = "stream" }
"""


def one_run(broker: Broker, run: int, args: argparse.Namespace) -> dict[str, float]:
    import pyarrow as pa

    from scow.plugins.spark.client import Client, Endpoint
    from scow.plugins.spark.source import Options, commit, stage

    url = broker.url
    options = Options.parse({"url": url, "address": "out", "timeout": "600"})
    sink = f"stall{run}"
    body = b"x" * args.size
    rows = pa.RecordBatch.from_arrays([pa.array([body] * args.count)], ["body"])
    staged = stage(options, sink, 0, iter([rows]))

    pings: list[float] = []
    stop = threading.Event()
    other = Client(Endpoint.parse(url, timeout=600))
    other.call("stream-sink", "bystander", "READ")  # connected and warm before timing

    def ping() -> None:
        while not stop.is_set():
            begin = time.perf_counter()
            other.call("stream-sink", "bystander", "READ")
            pings.append(time.perf_counter() - begin)

    pinger = threading.Thread(target=ping, daemon=True)
    cpu = broker.cpu_seconds()
    begin = time.perf_counter()
    pinger.start()
    commit(options, sink, 0, [staged])
    wall = time.perf_counter() - begin
    cpu = broker.cpu_seconds() - cpu
    stop.set()
    pinger.join()
    other.close()
    return {
        "wall": wall,
        "cpu_us_row": cpu / args.count * 1e6,
        "pings": len(pings),
        "ping_median_ms": statistics.median(pings) * 1000 if pings else 0.0,
        "ping_max_ms": max(pings) * 1000 if pings else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=250_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scow-commit-stall-") as tmp:
        broker = Broker(Path(tmp), plugins=PLUGINS, extra=QUEUES)
        broker.start()
        try:
            results = [one_run(broker, n, args) for n in range(args.runs)]
        finally:
            broker.stop()
    print(f"scow commit of {args.count:,} staged rows of {args.size} B, {platform_line()}")
    for n, r in enumerate(results, 1):
        print(
            f"  run {n}: commit {r['wall']:.2f} s, broker CPU {r['cpu_us_row']:.1f} us/row; "
            f"other connection: {r['pings']:.0f} round trips, median "
            f"{r['ping_median_ms']:.1f} ms, longest {r['ping_max_ms']:.0f} ms"
        )
    for key, label in (
        ("wall", "commit s"),
        ("cpu_us_row", "CPU us/row"),
        ("ping_max_ms", "longest round trip ms"),
    ):
        print(f"  median {label}: {statistics.median(r[key] for r in results):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
