"""What each queue costs a broker in memory: the RSS of `scow run` (file journal, paging)
with --queues queues declared in its config (each on an address of its own, as tenants'
or devices' queues are) against one with none, both idle after start-up, per queue.

    .venv/bin/python benchmarks/queue_memory.py [--queues 10000] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from paging_bench import Broker, mib
from run_perf import platform_line


def idle_rss(workdir: Path, queues: int) -> int:
    """RSS of a broker with `queues` declared queues, once it has settled."""
    declared = "".join(f'[queues."tenant.{n}"]\nrouting-type = "ANYCAST"\n' for n in range(queues))
    broker = Broker(workdir, extra=declared)
    broker.start()
    try:
        time.sleep(1.0)  # what start-up left to the loop's next turns
        return broker.rss()
    finally:
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(platform_line())
    print(f"# {' '.join(sys.argv)}")
    per_queue = []
    with tempfile.TemporaryDirectory(prefix="scow-queue-memory-") as tmp:
        for run in range(args.runs):
            empty = idle_rss(Path(tmp) / f"empty{run}", 0)
            full = idle_rss(Path(tmp) / f"full{run}", args.queues)
            per_queue.append((full - empty) / args.queues)
            print(f"run {run + 1}: RSS {mib(empty)} with no queue, {mib(full)} with "
                  f"{args.queues:,}: {per_queue[-1]:,.0f} B per queue")  # fmt: skip
    print(f"median: {statistics.median(per_queue):,.0f} B of RSS per queue")
    return 0


if __name__ == "__main__":
    sys.exit(main())
