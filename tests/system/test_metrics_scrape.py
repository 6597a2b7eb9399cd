"""A Prometheus scrape or the console's listings of a broker with many queues leave it
serving meanwhile.

With 10,000 queues (one per tenant or device, as brokers are used), the text of
`/metrics` took 0.7 s on the event loop and `/api/queues` and `/api/addresses` (which the
console asks for every second) 0.17 and 0.3 s: no connection was served meanwhile. Now a
scrape reads only the statistics there and makes its text on a worker thread, and a
listing describes a slice of queues or addresses per turn of the loop and is encoded on
a worker thread. The statistics themselves (every queue's and address's, which
`/api/broker` also reads: the console, every second) took 0.09 s; they too are read a
slice at a time.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.request

import pytest
from proton import Message
from proton.utils import BlockingConnection

from tests.system.topology import BrokerSpec

QUEUES = 3000


@pytest.mark.parametrize("path", ["/metrics", "/api/broker", "/api/queues", "/api/addresses"])
def test_a_scrape_of_thousands_of_queues_does_not_stop_the_broker_serving(system_broker, path):
    queues = {f"tenant.{n}": {"routing-type": "ANYCAST"} for n in range(QUEUES)}
    broker = system_broker(BrokerSpec(queues=queues))
    url = f"http://127.0.0.1:{broker.http_port}{path}"
    connection = BlockingConnection(f"amqp://127.0.0.1:{broker.port}", timeout=30)
    try:
        sender = connection.create_sender("probe")
        receiver = connection.create_receiver("probe", credit=1)

        def round_trip() -> None:
            sender.send(Message(body="ping"))
            receiver.receive(timeout=30)
            receiver.accept()

        for _ in range(20):  # warm: the queue exists, the client's paths are hot
            round_trip()
        scraped: list[bytes] = []
        window: list[float] = []

        def scrape() -> None:
            window.append(time.monotonic())
            with urllib.request.urlopen(url, timeout=60) as response:
                scraped.append(response.read())
            window.append(time.monotonic())

        # (longest gap between round trips, the scrape's time, round trips in it) of three
        # scrapes: a broker that stops serving while it makes the text shows it in every
        # one; a machine busy with other work lengthens some gaps, never shortens them
        scrapes: list[tuple[float, float, int]] = []
        for _ in range(3):
            scraper = threading.Thread(target=scrape)
            done = [time.monotonic()]
            scraper.start()
            while scraper.is_alive():
                round_trip()
                done.append(time.monotonic())
            scraper.join()
            began, ended = window[-2:]
            gaps = [b - a for a, b in itertools.pairwise(done) if b > began and a < ended]
            scrapes.append((max(gaps), ended - began, len(gaps)))
        longest, took, trips = min(scrapes, key=lambda s: s[0] / s[1])
        assert longest < took / 2, (
            f"no round trip for {longest:.3f} s of a {took:.3f} s scrape, in the best of "
            f"{len(scrapes)}: the broker stopped serving while it made the text "
            f"({trips} round trips in it)"
        )
    finally:
        connection.close()
    text = scraped[-1].decode()
    # every queue, the probe's too
    if path == "/metrics":
        assert text.count("artemis_message_count{") == QUEUES + 1
    elif path == "/api/broker":
        assert json.loads(text)["queues"] == QUEUES + 1
    else:
        assert len(json.loads(text)) == QUEUES + 1
