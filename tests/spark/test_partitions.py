"""How reads are split into Spark partitions: a micro-batch in two by default (both
executor cores read it), a small one whole, minPartitions when given."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from scow.plugins.spark.source import Options, ScowStreamReader
from tests.spark.conftest import stream


def ranges(broker_url: str, start: int, end: int, **options: str) -> list[tuple[int, int]]:
    reader = ScowStreamReader(Options.parse({"url": broker_url, "queues": "s", **options}))
    try:
        parts = reader.partitions({"s": start}, {"s": end})
    finally:
        reader.stop()
    assert parts[0].committed == start  # the first range moves the query's cursor
    return [(p.start, p.end) for p in parts]


def test_a_micro_batch_is_read_in_two_ranges_unless_it_is_small(streams):
    broker = streams.start({"s": stream()})
    assert ranges(broker.url, 0, 100_000) == [(0, 50_000), (50_000, 100_000)]
    assert ranges(broker.url, 7, 25_007) == [(7, 12_507), (12_507, 25_007)]
    assert ranges(broker.url, 0, 15_000) == [(0, 10_000), (10_000, 15_000)]
    assert ranges(broker.url, 0, 5_000) == [(0, 5_000)]
    assert ranges(broker.url, 0, 600_000) == [(0, 250_000), (250_000, 500_000), (500_000, 600_000)]


def test_min_partitions_splits_a_micro_batch_as_it_says(streams):
    broker = streams.start({"s": stream()})
    assert ranges(broker.url, 0, 30, minPartitions="3") == [(0, 10), (10, 20), (20, 30)]
    assert ranges(broker.url, 0, 30, minPartitions="1") == [(0, 30)]
