"""A stream's reads stay off the event loop: the first read of a large old segment (a
scan of the whole file for its index) and a selector's scan of every record it refuses
do not stall the other connections."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from proton import Described, symbol
from proton.reactor import Filter

from scow.plugins.spark import segments
from scow.plugins.spark.records import annotate
from scow.plugins.spark.stream import DEFAULT_SEGMENT_BYTES
from scow.protocols.amqp.codec import encode_message
from tests.spark.conftest import client, stream
from tests.wire.helpers import connected

#: Records of the old segment; only the last record of the stream has n = 1.
OLD_RECORDS = 150_000
SELECTOR = Described(symbol("apache.org:selector-filter:string"), "n = 1")


def write_stream(data_dir: Path) -> None:
    """Stream 's': one large old segment (its index is built by its first read, not at
    open, which indexes the last two segments) and two small ones after it."""
    refused = encode_message("x", application_properties={"n": 0})
    store = segments.open_store(data_dir, "s", DEFAULT_SEGMENT_BYTES, {})
    store.open()
    for first in range(0, OLD_RECORDS, 50_000):
        store.append([(seq, 1000, seq, refused) for seq in range(first, first + 50_000)])
    store.close()
    store = segments.open_store(data_dir, "s", 1, {})  # each record rolls a segment
    store.open()
    wanted = annotate(encode_message("y", application_properties={"n": 1}), OLD_RECORDS + 1, 1)
    store.append([(OLD_RECORDS, 1000, OLD_RECORDS, refused), (OLD_RECORDS + 1, 1, 0, wanted)])
    store.close()


def test_a_selector_scan_of_a_large_old_segment_does_not_block_the_loop(streams, tmp_path):
    write_stream(tmp_path / "data")
    broker = streams.start({"s": stream()})
    lags: list[float] = []
    running = True

    async def probe() -> None:  # on the broker's loop: how late each 5 ms tick runs
        while running:
            started = time.monotonic()
            await asyncio.sleep(0.005)
            lags.append(time.monotonic() - started - 0.005)

    probing = asyncio.run_coroutine_threadsafe(probe(), broker.loop)
    round_trips: list[float] = []

    def other_connection() -> None:  # management round trips on a connection of its own
        c = client(broker.url)
        try:
            while running:
                started = time.monotonic()
                c.call("stream", "s", "READ", {})
                round_trips.append(time.monotonic() - started)
        finally:
            c.close()

    other = threading.Thread(target=other_connection)
    other.start()
    try:
        time.sleep(0.2)
        before, trips_before = len(lags), len(round_trips)
        started = time.monotonic()
        with connected(broker.url) as conn:
            offset = symbol("scow:stream-offset")
            receiver = conn.create_receiver(
                "s", name="first", options=Filter({offset: "first", symbol("selector"): SELECTOR})
            )
            wanted = receiver.receive(timeout=60)
        scan = time.monotonic() - started
        during, trips = lags[before:], round_trips[trips_before:]
    finally:
        running = False
        other.join(10)
        probing.result(10)
    assert wanted.annotations["x-opt-sequence-number"] == OLD_RECORDS + 1
    assert scan > 0.3, f"the scan took {scan:.3f} s: too short to show anything"
    assert len(during) >= 10 and trips, "the probe or the other connection did not run"
    # a loop that read the stream itself would be late by the whole scan
    assert max(during) < scan / 4, f"loop lag up to {max(during):.3f} s in a {scan:.3f} s scan"
    assert max(trips) < scan / 2, f"round trips up to {max(trips):.3f} s in a {scan:.3f} s scan"
