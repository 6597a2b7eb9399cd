"""Flow to disk figures: a transient backlog past a threshold, its RSS, and reading it back.

Starts `scow run` with the `flow-to-disk` plugin and a large `global-max-size` (so the
address never pages: flow to disk alone bounds the bodies in memory), sends --count
non-durable --size messages to one queue with no consumer while sampling the broker's
RSS, then consumes them (1 consumer, at-least-once). The same backlog on a broker without
the plugin (everything in memory) gives the in-memory consume rate, same run.

    .venv/bin/python benchmarks/flow_to_disk_bench.py                # 5 M x 1 KiB, 64 MiB
    .venv/bin/python benchmarks/flow_to_disk_bench.py --quick        # counts / 100
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from paging_bench import PLUGINS, Broker, backlog_client, mib, sampling
from run_perf import platform_line


def run(root: Path, name: str, args: argparse.Namespace, *, flow: bool) -> dict[str, Any]:
    extra = f'[flow-to-disk]\nflow-to-disk-threshold = "{args.threshold}"\n' if flow else ""
    plugins = PLUGINS + (', "flow-to-disk"' if flow else "")
    broker = Broker(root / name, broker='global-max-size = "64GiB"', plugins=plugins, extra=extra)
    broker.start()
    try:
        idle = broker.rss()
        samples: list[int] = []
        with sampling(broker, samples):
            sent = backlog_client(f"{broker.url}/backlog", "send", args)
            received = backlog_client(f"{broker.url}/backlog", "receive", args)
    finally:
        broker.stop()
    return {
        "idle": idle,
        "peak": max(samples),
        "send": sent["send_rate"],
        "receive": received["receive_rate"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=5_000_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--threshold", default="64MiB")
    parser.add_argument("--quick", action="store_true", help="--count / 100")
    args = parser.parse_args()
    if args.quick:
        args.count //= 100
    print(platform_line())
    print(f"# {' '.join(sys.argv)}")
    with tempfile.TemporaryDirectory(prefix="scow-flow-") as tmp:
        root = Path(tmp)
        flowed = run(root, "flow", args, flow=True)
        memory = run(root, "memory", args, flow=False)
    print(f"{args.count:,} x {args.size} B non-durable backlog, then consumed:")
    for name, r in (("flow to disk " + args.threshold, flowed), ("in memory", memory)):
        print(
            f"  {name:<22} RSS idle {mib(r['idle'])}, peak {mib(r['peak'])}; "
            f"send {r['send']:,.0f} msg/s, consume {r['receive']:,.0f} msg/s"
        )
    print(f"  consume rate flow to disk / in memory: {flowed['receive'] / memory['receive']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
