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

Then, per run, a rollback: --rollback-count rows staged one to a message (no packs: the
most messages a commit can take), whose commit fails in its last slice (the last row
names an address that may not be created), so that the broker rolls the transaction
back and every staged message goes back to its staging queue. Prints the time from
COMMIT until the staging queue holds them all again, and the other connection's round
trips meanwhile (their longest: the loop's longest stall).

    .venv/bin/python benchmarks/commit_stall.py                      # 250,000 rows, 3 runs
    .venv/bin/python benchmarks/commit_stall.py --count 50000 --runs 1
    .venv/bin/python benchmarks/commit_stall.py --rollback-count 0   # no rollback
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

[address-settings."nowhere"]
auto-create-addresses = false
"""


def one_run(broker: Broker, run: int, args: argparse.Namespace) -> dict[str, float]:
    import pyarrow as pa

    from scow.plugins.spark.source import Options, commit, stage

    url = broker.url
    options = Options.parse({"url": url, "address": "out", "timeout": "600"})
    sink = f"stall{run}"
    body = b"x" * args.size
    rows = pa.RecordBatch.from_arrays([pa.array([body] * args.count)], ["body"])
    staged = stage(options, sink, 0, iter([rows]))

    with Pinger(url) as pinger:
        cpu = broker.cpu_seconds()
        begin = time.perf_counter()
        commit(options, sink, 0, [staged])
        wall = time.perf_counter() - begin
        cpu = broker.cpu_seconds() - cpu
    return {"wall": wall, "cpu_us_row": cpu / args.count * 1e6, **pinger.figures()}


def rollback_run(broker: Broker, run: int, args: argparse.Namespace) -> dict[str, float]:
    import pyarrow as pa

    from scow.plugins.spark.client import Client, Endpoint
    from scow.plugins.spark.schema import messages_of

    count = args.rollback_count
    sink = f"undo{run}"
    driver = Client(Endpoint.parse(broker.url, timeout=600))
    answer = driver.call(
        "stream-sink", sink, "STAGE", {"batch": 0, "partition": 0, "attempt": 0, "to": "out"}
    )
    staging = answer["address"]
    to = [None] * (count - 1) + ["nowhere"]  # the last row fails the last slice
    rows = pa.RecordBatch.from_arrays(
        [pa.array([b"x" * args.size] * count), pa.array(to, pa.string())], ["body", "to"]
    )
    driver.send(staging, messages_of(rows))  # one row a message: no packs

    def staged() -> int:
        return int(driver.call("queue", staging, "READ")["message-count"])

    assert staged() == count
    with Pinger(broker.url) as pinger:
        begin = time.perf_counter()
        driver.call("stream-sink", sink, "COMMIT", {"batch": 0}, [[0, 0]])
        while str(0) not in driver.call("stream-sink", sink, "READ")["failed"]:
            time.sleep(0.01)
        while staged() != count:
            time.sleep(0.01)
        wall = time.perf_counter() - begin
    driver.call("stream-sink", sink, "ABORT", {"batch": 0})
    driver.close()
    return {"wall": wall, **pinger.figures()}


class Pinger:
    """A second connection asking the broker a small question (a sink's READ) in a loop
    while the `with` block runs: its round trips show how long the loop stalls."""

    def __init__(self, url: str) -> None:
        from scow.plugins.spark.client import Client, Endpoint

        self.pings: list[float] = []
        self.stop = threading.Event()
        self.other = Client(Endpoint.parse(url, timeout=600))
        self.other.call("stream-sink", "bystander", "READ")  # connected and warm first
        self.thread = threading.Thread(target=self._ping, daemon=True)

    def _ping(self) -> None:
        while not self.stop.is_set():
            begin = time.perf_counter()
            self.other.call("stream-sink", "bystander", "READ")
            self.pings.append(time.perf_counter() - begin)

    def __enter__(self) -> Pinger:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()
        self.other.close()

    def figures(self) -> dict[str, float]:
        pings = self.pings
        return {
            "pings": len(pings),
            "ping_median_ms": statistics.median(pings) * 1000 if pings else 0.0,
            "ping_max_ms": max(pings) * 1000 if pings else 0.0,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=250_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rollback-count", type=int, default=50_000, help="0: no rollback")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scow-commit-stall-") as tmp:
        broker = Broker(Path(tmp), plugins=PLUGINS, extra=QUEUES)
        broker.start()
        try:
            results = [one_run(broker, n, args) for n in range(args.runs)]
            rollbacks = [
                rollback_run(broker, n, args)
                for n in range(args.runs if args.rollback_count else 0)
            ]
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
    if rollbacks:
        print(f"rollback of a failed commit of {args.rollback_count:,} rows staged one a message")
    for n, r in enumerate(rollbacks, 1):
        print(
            f"  run {n}: COMMIT to all back in staging {r['wall']:.2f} s; other connection: "
            f"{r['pings']:.0f} round trips, median {r['ping_median_ms']:.1f} ms, longest "
            f"{r['ping_max_ms']:.0f} ms"
        )
    if rollbacks:
        for key, label in (("wall", "rollback s"), ("ping_max_ms", "longest round trip ms")):
            print(f"  median {label}: {statistics.median(r[key] for r in rollbacks):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
