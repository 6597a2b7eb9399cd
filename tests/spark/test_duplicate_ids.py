"""The sink's rows carry `_AMQ_DUPL_ID` from sink, batch, partition and row: a batch that
reaches its address again, past the staging area and the sink's marker, is kept once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import client, publish, stream, wait_stream

pytestmark = pytest.mark.spark


def bodies(n: int, start: int = 0) -> list[str]:
    return [f"m{i:04d}" for i in range(start, start + n)]


def out_rows(spark: Any, url: str) -> list[Any]:
    df = spark.read.format("scow").option("url", url).option("queues", "out").load()
    return sorted(df.select("body", "application_properties").collect(), key=lambda r: r.body)


def test_a_replayed_batch_sent_past_the_staging_commit_writes_nothing_twice(
    spark, streams, tmp_path: Path
):
    import pyarrow as pa

    from scow.core.duplicates import DUPLICATE_ID_PROPERTY
    from scow.plugins.spark.schema import messages_of
    from scow.plugins.spark.source import duplicate_ids

    broker = streams.start({"a": stream(), "out": stream()})
    publish(broker.url, "a", bodies(20))
    wait_stream(broker, "a", 20)
    query = (
        spark.readStream.format("scow")
        .option("url", broker.url)
        .option("queues", "a")
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "10")
        .load()
        .select("body")
        .writeStream.format("scow")
        .option("url", broker.url)
        .option("address", "out")
        .option("sinkId", "job")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    rows = out_rows(spark, broker.url)
    assert [bytes(r.body).decode() for r in rows] == bodies(20)
    # batch 0 held rows 0-9 of partition 0, batch 1 the next ten
    assert [r.application_properties[DUPLICATE_ID_PROPERTY] for r in rows] == [
        f"job:{batch}:0:{row}" for batch in (0, 1) for row in range(10)
    ]
    # staging addresses kept none of them (their own caches would only grow)
    caches = broker.call(lambda: list(broker.broker.duplicate_ids))
    assert caches == ["out"]

    # batch 1 again, as its task sends it, straight to the address: no STAGE, no COMMIT,
    # no marker to say it was written; and one row of a batch 2 beside it
    replay = pa.RecordBatch.from_pylist([{"body": b.encode()} for b in bodies(10, 10)])
    fresh = pa.RecordBatch.from_pylist([{"body": b"new"}])
    sent = client(broker.url)
    try:
        assert sent.send("out", messages_of(replay, duplicate_ids("job", 1, 0))) == 10
        assert sent.send("out", messages_of(fresh, duplicate_ids("job", 2, 0))) == 1
    finally:
        sent.close()
    wait_stream(broker, "out", 21)
    assert [bytes(r.body).decode() for r in out_rows(spark, broker.url)] == [*bodies(20), "new"]
    assert broker.queue_stats("out")["next-sequence"] == 21
