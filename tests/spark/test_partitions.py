"""How reads are split into Spark partitions: a micro-batch in two by default (both
executor cores read it), a small one whole, minPartitions when given; several brokers'
ranges in turns."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from scow.plugins.spark.source import Options, ScowStreamReader
from tests.spark.conftest import publish, stream, wait_stream


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


def test_the_ranges_of_several_brokers_take_turns_so_tasks_at_once_read_different_ones(
    streams,
):
    from scow.plugins.spark.source import ScowBatchReader

    a, b = (streams.start({"s": stream()}, name=name) for name in ("a", "b"))
    publish(a.url, "s", [f"a{i}" for i in range(30)])
    publish(b.url, "s", [f"b{i}" for i in range(20)])
    wait_stream(a, "s", 30)
    wait_stream(b, "s", 20)
    options = {"url": f"{a.url},{b.url}", "queues": "s", "maxMessagesPerPartition": "10"}
    batch = ScowBatchReader(Options.parse(options)).partitions()
    assert [(p.broker, p.start, p.end) for p in batch] == [
        (0, 0, 10), (1, 0, 10), (0, 10, 20), (1, 10, 20), (0, 20, 30)
    ]  # fmt: skip
    reader = ScowStreamReader(Options.parse(options))
    try:
        keys = {f"127.0.0.1:{broker.port}/s": 0 for broker in (a, b)}
        micro = reader.partitions(keys, {key: 20 for key in keys})
    finally:
        reader.stop()
    assert [(p.broker, p.start, p.committed) for p in micro] == [
        (0, 0, 0), (1, 0, 0), (0, 10, None), (1, 10, None)
    ]  # fmt: skip
