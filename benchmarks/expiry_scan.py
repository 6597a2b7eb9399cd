"""What the periodic expiry scan costs a broker holding a large backlog in memory: the
longest pause it puts into a client's round trips.

Starts `scow run` (file journal, paging, a memory limit the backlog fits in, an expiry
scan every --period ms), sends --count non-durable --size messages to a queue nothing
consumes (plain messages: no time to live), then --ttl-count more with a time to live
of an hour (they wait as objects, and the scan asks about each), and then runs
AMQP round trips on another queue (send one, receive it, accept it) for --seconds:
each scan of the backlog holds every round trip up while it runs. Prints the median
round trip and the longest, per round.

    .venv/bin/python benchmarks/expiry_scan.py [--count 500000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from paging_bench import Broker, client
from proton import Message
from proton.utils import BlockingConnection
from run_perf import platform_line


def round_trips(url: str, seconds: float) -> list[float]:
    """Seconds each round trip took, for `seconds`."""
    connection = BlockingConnection(url, timeout=60)
    try:
        sender = connection.create_sender("probe")
        receiver = connection.create_receiver("probe", credit=1)
        took = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            began = time.monotonic()
            sender.send(Message(body="ping"))
            receiver.receive(timeout=60)
            receiver.accept()
            took.append(time.monotonic() - began)
        return took
    finally:
        connection.close()


def send_with_ttl(url: str, count: int, size: int) -> None:
    """`count` messages to the backlog that expire in an hour, each acknowledged."""
    connection = BlockingConnection(url, timeout=60)
    try:
        sender = connection.create_sender("backlog")
        for _ in range(count):
            sender.send(Message(body=b"x" * size, ttl=3600))
    finally:
        connection.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=500_000, help="plain messages waiting")
    parser.add_argument("--ttl-count", type=int, default=100, help="messages with a ttl waiting")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--period", type=int, default=1000, help="expiry scan period, ms")
    parser.add_argument("--seconds", type=float, default=5.0, help="of round trips per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(platform_line())
    print(f"# {' '.join(sys.argv)}")
    with tempfile.TemporaryDirectory(prefix="scow-expiry-") as tmp:
        broker = Broker(
            Path(tmp) / "b",
            broker=f'global-max-size = "2GiB"\nmessage-expiry-scan-period = {args.period}',
        )
        broker.start()
        try:
            client(f"{broker.url}/backlog", "--mode", "send", "--count", str(args.count),
                   "--size", str(args.size))  # fmt: skip
            send_with_ttl(f"{broker.url}", args.ttl_count, args.size)
            longest = []
            for n in range(args.rounds):
                took = round_trips(broker.url, args.seconds)
                longest.append(max(took))
                median = statistics.median(took)
                print(f"round {n + 1}: {len(took):,} round trips, median {median * 1e3:.2f} ms, "
                      f"longest {max(took) * 1e3:.1f} ms")  # fmt: skip
        finally:
            broker.stop()
    print(f"median of the rounds' longest round trip: {statistics.median(longest) * 1e3:.1f} ms "
          f"({args.count:,} plain + {args.ttl_count:,} with a ttl waiting, a scan every "
          f"{args.period} ms)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
