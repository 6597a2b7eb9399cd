"""Which sink a streaming write commits to: the query's own (its checkpoint's), or `sinkId`.

A sink counts committed batch ids; a batch at or below its count is a replay and is
dropped. So two queries must never share a sink by accident (their batch ids overlap),
and a query that does share one through an old `sinkId` is refused, not silently emptied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import management, publish, stream, wait_stream

pytestmark = pytest.mark.spark


def bodies(prefix: str, n: int, start: int = 0) -> list[str]:
    return [f"{prefix}{i:04d}" for i in range(start, start + n)]


def copy(spark: Any, url: str, source: str, checkpoint: Path, **options: str) -> Any:
    """Copy stream queue `source` to address `out` until caught up (availableNow)."""
    reader = spark.readStream.format("scow").option("url", url).option("queues", source)
    reader = reader.option("startingOffsets", "earliest")
    for key in ("maxMessagesPerTrigger",):
        if key in options:
            reader = reader.option(key, options.pop(key))
    writer = (
        reader.load()
        .select("body")
        .writeStream.format("scow")
        .option("url", url)
        .option("address", "out")
        .option("checkpointLocation", str(checkpoint))
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(180)
    return query


def out_bodies(spark: Any, url: str) -> list[str]:
    df = spark.read.format("scow").option("url", url).option("queues", "out").load()
    return sorted(bytes(r.body).decode() for r in df.collect())


def test_two_queries_writing_to_one_address_both_land_all_their_rows(spark, streams, tmp_path):
    broker = streams.start({"a": stream(), "b": stream(), "out": stream()})
    publish(broker.url, "a", bodies("a", 30))
    publish(broker.url, "b", bodies("b", 20))
    wait_stream(broker, "a", 30)
    wait_stream(broker, "b", 20)
    copy(spark, broker.url, "a", tmp_path / "cp-a")
    copy(spark, broker.url, "b", tmp_path / "cp-b")  # its batch 0 too, to the same address
    wait_stream(broker, "out", 50)
    assert out_bodies(spark, broker.url) == bodies("a", 30) + bodies("b", 20)

    # each restarted on its own checkpoint: the same sink again, only the new rows
    publish(broker.url, "a", bodies("a", 5, 30))
    wait_stream(broker, "a", 35)
    copy(spark, broker.url, "a", tmp_path / "cp-a")
    copy(spark, broker.url, "b", tmp_path / "cp-b")
    wait_stream(broker, "out", 55)
    assert out_bodies(spark, broker.url) == bodies("a", 35) + bodies("b", 20)
    assert not [n for n in broker.call(lambda: list(broker.broker.queues)) if "staging." in n]


def test_an_old_sink_id_on_a_new_checkpoint_is_refused_naming_the_sink_and_its_batch(
    spark, streams, tmp_path
):
    broker = streams.start({"a": stream(), "out": stream()})
    publish(broker.url, "a", bodies("a", 30))
    wait_stream(broker, "a", 30)
    copy(spark, broker.url, "a", tmp_path / "old", sinkId="orders-job", maxMessagesPerTrigger="10")
    wait_stream(broker, "out", 30)
    assert management(broker.url, "stream-sink", "orders-job", "READ")["committed-batch"] == 2

    with pytest.raises(Exception, match=r"sink 'orders-job' has committed batch 2"):
        copy(spark, broker.url, "a", tmp_path / "new", sinkId="orders-job")
    assert out_bodies(spark, broker.url) == bodies("a", 30)  # nothing dropped, nothing twice

    # the old checkpoint still goes on with its sink
    publish(broker.url, "a", bodies("a", 5, 30))
    wait_stream(broker, "a", 35)
    copy(spark, broker.url, "a", tmp_path / "old", sinkId="orders-job")
    wait_stream(broker, "out", 35)
    assert out_bodies(spark, broker.url) == bodies("a", 35)
    assert management(broker.url, "stream-sink", "orders-job", "READ")["committed-batch"] == 3
