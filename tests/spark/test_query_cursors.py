"""Each streaming query moves its own broker cursor unless `cursor` names a shared one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import management, publish, stream, wait_stream

pytestmark = pytest.mark.spark

BODY = "x" * 100


def bodies(n: int, start: int = 0) -> list[str]:
    return [f"m{i:04d}{BODY}" for i in range(start, start + n)]


def drain(spark: Any, url: str, checkpoint: Path, **options: str) -> Any:
    """Read stream `s` to the noop sink until caught up (availableNow)."""
    reader = spark.readStream.format("scow").option("url", url).option("queues", "s")
    reader = reader.option("startingOffsets", "earliest")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    return query


def cursors(url: str) -> dict[str, int]:
    positions = management(url, "stream", "s", "READ")["cursor-positions"]
    return {name: position["sequence"] for name, position in positions.items()}


def test_two_queries_on_one_stream_move_their_own_cursors_and_retention_keeps_the_slower(
    spark, streams, tmp_path
):
    broker = streams.start({"s": stream(**{"segment-bytes": 2000, "retention-cursors": True})})
    publish(broker.url, "s", bodies(60))
    wait_stream(broker, "s", 60)
    slow = drain(spark, broker.url, tmp_path / "slow", maxMessagesPerTrigger="60")
    fast = drain(spark, broker.url, tmp_path / "fast", maxMessagesPerTrigger="20")
    # the cursor trails by the batch in flight: a batch's tasks move it to the batch's start
    assert cursors(broker.url) == {f"query-{slow.id}": 0, f"query-{fast.id}": 40}
    assert management(broker.url, "stream", "s", "READ")["first-sequence"] == 0  # slow's

    publish(broker.url, "s", bodies(40, 60))
    wait_stream(broker, "s", 100)
    again = drain(spark, broker.url, tmp_path / "slow", maxMessagesPerTrigger="60")
    assert again.id == slow.id  # the checkpoint keeps the query's id, so its cursor
    assert cursors(broker.url) == {f"query-{slow.id}": 60, f"query-{fast.id}": 40}
    first = management(broker.url, "stream", "s", "READ")["first-sequence"]
    assert 0 < first <= 40  # what both have passed may go, what fast still needs stays


def test_a_named_cursor_is_moved_at_commit_and_no_query_cursor_is_made(spark, streams, tmp_path):
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", bodies(30))
    wait_stream(broker, "s", 30)
    drain(spark, broker.url, tmp_path / "cp", maxMessagesPerTrigger="10", cursor="shared")
    assert list(cursors(broker.url)) == ["shared"]
    assert cursors(broker.url)["shared"] in (20, 30)


def test_starting_at_a_cursor_needs_the_cursor_option(spark, streams):
    broker = streams.start({"s": stream()})
    reader = spark.read.format("scow").option("url", broker.url).option("queues", "s")
    with pytest.raises(Exception, match="startingOffsets = cursor needs the cursor option"):
        reader.option("startingOffsets", "cursor").load().collect()
