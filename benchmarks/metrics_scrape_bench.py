"""What a Prometheus scrape costs the broker: throughput with /metrics scraped every
second vs not scraped, same run, alternating (1 producer + 1 consumer, 1 KiB, at-least-once).

With --pause-queues N it measures instead how long a scrape of a broker with N queues
(declared in its config, each on an address of its own) stops it serving: AMQP round
trips (send one, receive it, accept it) run back to back during each of --rounds scrapes
of /metrics, /api/broker, /api/queues and /api/addresses, and the longest gap between
two of them is printed with the scrape's own time (medians over the rounds).

    .venv/bin/python benchmarks/metrics_scrape_bench.py [--rounds 3] [--count 200000]
    .venv/bin/python benchmarks/metrics_scrape_bench.py --pause-queues 10000
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from paging_bench import PLUGINS, Broker, client
from proton import Message
from proton.utils import BlockingConnection
from run_perf import free_port, platform_line

PATHS = ("/metrics", "/api/broker", "/api/queues", "/api/addresses")


def scrape(port: int, stop: threading.Event, scrapes: list[int]) -> None:
    """GET /metrics once a second until `stop`; each scrape's size goes in `scrapes`."""
    while not stop.wait(1.0):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as response:
            scrapes.append(len(response.read()))


def longest_pause(url: str, scrape_url: str) -> tuple[float, float]:
    """(the longest gap between AMQP round trips during one GET of `scrape_url`, the
    GET's seconds)."""
    connection = BlockingConnection(url, timeout=60)
    try:
        sender = connection.create_sender("probe")
        receiver = connection.create_receiver("probe", credit=1)

        def round_trip() -> None:
            sender.send(Message(body="ping"))
            receiver.receive(timeout=60)
            receiver.accept()

        for _ in range(20):
            round_trip()
        window: list[float] = []

        def scrape() -> None:
            window.append(time.monotonic())
            with urllib.request.urlopen(scrape_url, timeout=120) as response:
                response.read()
            window.append(time.monotonic())

        scraper = threading.Thread(target=scrape)
        done = [time.monotonic()]
        scraper.start()
        while scraper.is_alive():
            round_trip()
            done.append(time.monotonic())
        scraper.join()
    finally:
        connection.close()
    began, ended = window
    gaps = [b - a for a, b in itertools.pairwise(done) if b > began and a < ended]
    return max(gaps), ended - began


def pauses(args: argparse.Namespace, tmp: str) -> None:
    port = free_port()
    declared = "".join(
        f'[queues."tenant.{n}"]\nrouting-type = "ANYCAST"\n' for n in range(args.pause_queues)
    )
    broker = Broker(
        Path(tmp) / "b",
        plugins=PLUGINS + ', "management"',
        extra=f'[management]\nlisten = "127.0.0.1:{port}"\n{declared}',
    )
    broker.start()
    try:
        for path in PATHS:
            measured = [
                longest_pause(broker.url, f"http://127.0.0.1:{port}{path}")
                for _ in range(args.rounds)
            ]
            gap = statistics.median(m[0] for m in measured)
            took = statistics.median(m[1] for m in measured)
            print(f"{path:<16} {args.pause_queues:,} queues: longest pause {gap * 1e3:6.1f} ms "
                  f"in a {took * 1e3:6.1f} ms scrape (medians of {args.rounds})")  # fmt: skip
    finally:
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--queues", type=int, default=100, help="extra queues in /metrics")
    parser.add_argument(
        "--pause-queues", type=int, default=0, help="measure pauses with this many queues"
    )
    args = parser.parse_args()
    print(platform_line())
    print(f"# {' '.join(sys.argv)}")
    if args.pause_queues:
        with tempfile.TemporaryDirectory(prefix="scow-metrics-") as tmp:
            pauses(args, tmp)
        return 0
    rates: dict[str, list[float]] = {"scraped every 1 s": [], "not scraped": []}
    with tempfile.TemporaryDirectory(prefix="scow-metrics-") as tmp:
        port = free_port()
        broker = Broker(
            Path(tmp) / "b",
            plugins=PLUGINS + ', "management"',
            extra=f'[management]\nlisten = "127.0.0.1:{port}"\n',
        )
        broker.start()
        try:
            for i in range(args.queues):  # something for each scrape to report
                client(f"{broker.url}/filler{i}", "--mode", "send", "--count", "10")
            for n in range(args.rounds):
                for name in rates:
                    stop = threading.Event()
                    scrapes: list[int] = []
                    scraper = threading.Thread(
                        target=scrape, args=(port, stop, scrapes), daemon=True
                    )
                    if name.startswith("scraped"):
                        scraper.start()
                    result = client(
                        f"{broker.url}/pair{n}{name[0]}", "--count", str(args.count),
                        "--size", "1024",
                    )  # fmt: skip
                    stop.set()
                    if scraper.is_alive():
                        scraper.join()
                    rates[name].append(result["receive_rate"])
                    print(f"round {n + 1} {name:<18} {result['receive_rate']:>10,.0f} msg/s "
                          f"({len(scrapes)} scrapes)")  # fmt: skip
        finally:
            broker.stop()
    medians = {name: statistics.median(r) for name, r in rates.items()}
    for name, median in medians.items():
        print(f"median {name:<18} {median:>10,.0f} msg/s")
    ratio = medians["scraped every 1 s"] / medians["not scraped"]
    print(f"ratio scraped / not scraped: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
