"""A restrictive selector behind a paged backlog: seconds until its messages arrive.

The example of the paging documentation: --count messages with `color = 'blue'` are sent
to an address that pages everything (`max-size-bytes = 0`; `--max-size-bytes 128MiB`
keeps the first of them in memory, as the packaged config's derived `global-max-size`
does, so the selector also scans a queue's memory), then 10 with
`color = 'red'`; a consumer attaches with the selector `color = 'red'` and the time until
it holds all 10 is measured, with the broker's RSS (sampled every 0.1 s). Then 10 more
red ones are sent and a consumer with `color LIKE 'r%'` (which page summaries cannot
use: the scan reads every record) is timed the same way, for comparison.

With --stream the same records go to a stream queue (`x-queue-type = "stream"`, the
spark plugin) instead, and the consumers read it from its first record
(`scow:stream-offset`) with the same selectors: chunk summaries take the place of page
summaries.

With --arguments the queue is declared at startup with those arguments (a TOML inline
table's keys, e.g. `'"qpid.priorities" = 10'` for a priority queue).

`scow run` is a subprocess; `scow perf client --mode send --property color=...` fills
the backlog; the selector consumers are python-qpid-proton's blocking client.

    .venv/bin/python benchmarks/selector_scan.py                  # 1 M x 1 KiB
    .venv/bin/python benchmarks/selector_scan.py --count 10000000 --size 100
    .venv/bin/python benchmarks/selector_scan.py --stream         # a stream of 1 M x 1 KiB
    .venv/bin/python benchmarks/selector_scan.py --max-size-bytes 128MiB  # memory, then pages
    .venv/bin/python benchmarks/selector_scan.py --max-size-bytes 128MiB \\
        --arguments '"qpid.priorities" = 10'                       # a priority queue
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from paging_bench import PLUGINS, Broker, client, mib, sampling
from proton import Described, symbol
from proton.reactor import Filter, Selector
from proton.utils import BlockingConnection
from run_perf import platform_line

ADDRESS = "colors"
MATCHES = 10
#: The queue declared at startup with --stream (read from its first record) or
#: --arguments.
DECLARED = """
[queues."{address}"]
routing-type = "ANYCAST"
arguments = {{ {arguments} }}
"""


def send(broker: Broker, count: int, size: int, color: str) -> float:
    result = client(
        f"{broker.url}/{ADDRESS}", "--mode", "send", "--count", str(count), "--size", str(size),
        "--property", f"color={color}",
    )  # fmt: skip
    return float(result["send_rate"])


def time_selector(broker: Broker, selector: str, timeout: float, stream: bool) -> float:
    """Seconds from attaching a consumer with `selector` until it holds MATCHES messages
    (a stream is read from its first record)."""
    if stream:
        options: Filter = Filter(
            {
                symbol("scow:stream-offset"): "first",
                symbol("selector"): Described(
                    symbol("apache.org:selector-filter:string"), selector
                ),
            }
        )
    else:
        options = Selector(selector)
    connection = BlockingConnection(broker.url, timeout=timeout)
    try:
        began = time.monotonic()
        receiver = connection.create_receiver(ADDRESS, credit=MATCHES, options=options)
        for _ in range(MATCHES):
            message = receiver.receive(timeout=timeout)
            if message.properties.get("color") != "red":
                raise SystemExit(f"selector {selector!r} delivered {message.properties}")
            receiver.accept()
        took = time.monotonic() - began
        receiver.close()
    finally:
        with contextlib.suppress(Exception):
            connection.close()
    return took


def run(args: argparse.Namespace, root: Path) -> dict[str, float]:
    if args.stream:
        extra = DECLARED.format(address=ADDRESS, arguments='"x-queue-type" = "stream"')
        broker = Broker(root / "broker", plugins=f'{PLUGINS}, "spark"', extra=extra)
    else:
        broker = Broker(
            root / "broker",
            settings=f'max-size-bytes = "{args.max_size_bytes}"',
            plugins=f'{PLUGINS}, "priority-queues", "last-value-queues", "qpid-paged-queues"',
            extra=DECLARED.format(address=ADDRESS, arguments=args.arguments)
            if args.arguments
            else "",
        )
    broker.start()
    try:
        rate = send(broker, args.count, args.size, "blue")
        send(broker, MATCHES, args.size, "red")
        idle = broker.rss()
        samples: list[int] = []
        with sampling(broker, samples, period=0.1):
            summary = time_selector(broker, "color = 'red'", args.timeout, args.stream)
        if not args.stream:  # the stream keeps the first red ones: its LIKE read finds them
            send(broker, MATCHES, args.size, "red")
        scan = time_selector(broker, "color LIKE 'r%'", args.timeout, args.stream)
        after = broker.rss()
    finally:
        broker.stop()
    return {
        "send_rate": rate,
        "summary_s": summary,
        "scan_s": scan,
        "rss_before": idle,
        "rss_peak": max(samples),
        "rss_after": after,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="non-matching messages")
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--runs", type=int, default=1, help="brokers, each filled anew")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait")
    parser.add_argument(
        "--stream", action="store_true", help="a stream queue instead of a paged address"
    )
    parser.add_argument(
        "--max-size-bytes", default="0", help="the address's max-size-bytes (default 0: page all)"
    )
    parser.add_argument(
        "--arguments", default="", help="queue arguments, as a TOML inline table's contents"
    )
    args = parser.parse_args()
    print(platform_line())
    print(f"# {' '.join(sys.argv)}")
    results = []
    with tempfile.TemporaryDirectory(prefix="scow-selector-scan-") as tmp:
        for run_index in range(args.runs):
            workdir = Path(tmp) / str(run_index)
            workdir.mkdir()
            result = run(args, workdir)
            results.append(result)
            print(
                f"run {run_index + 1}: {'a stream of ' if args.stream else ''}"
                f"{args.count:,} x {args.size} B blue then {MATCHES} red "
                f"(sent at {result['send_rate']:,.0f} msg/s): color = 'red' got all "
                f"{MATCHES} in {result['summary_s']:.2f} s (broker RSS {mib(result['rss_before'])}"
                f", peak {mib(result['rss_peak'])}); color LIKE 'r%' (no summary) "
                f"{result['scan_s']:.2f} s; RSS after {mib(result['rss_after'])}"
            )
    if args.runs > 1:
        for key, what in (("summary_s", "color = 'red'"), ("scan_s", "color LIKE 'r%'")):
            print(f"median {what}: {statistics.median(r[key] for r in results):.2f} s")
    return 0


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parent)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
