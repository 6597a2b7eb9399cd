"""What a Prometheus scrape costs the broker: throughput with /metrics scraped every
second vs not scraped, same run, alternating (1 producer + 1 consumer, 1 KiB, at-least-once).

    .venv/bin/python benchmarks/metrics_scrape_bench.py [--rounds 3] [--count 200000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

from paging_bench import PLUGINS, Broker, client
from run_perf import free_port, platform_line


def scrape(port: int, stop: threading.Event, scrapes: list[int]) -> None:
    """GET /metrics once a second until `stop`; each scrape's size goes in `scrapes`."""
    while not stop.wait(1.0):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as response:
            scrapes.append(len(response.read()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--queues", type=int, default=100, help="extra queues in /metrics")
    args = parser.parse_args()
    print(platform_line())
    print(f"# {' '.join(sys.argv)}")
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
