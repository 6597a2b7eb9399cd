"""One query over several brokers: `url` lists them; reads take each (broker, stream) as
its own offset key and partitions, writes spread rows over them and commit on each."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import management, publish, stream, wait_stream

pytestmark = pytest.mark.spark


def bodies(prefix: str, n: int, start: int = 0) -> list[str]:
    return [f"{prefix}{i:04d}" for i in range(start, start + n)]


def read_bodies(spark: Any, url: str, queue: str = "out") -> list[str]:
    df = spark.read.format("scow").option("url", url).option("queues", queue).load()
    return sorted(bytes(r.body).decode() for r in df.collect())


@pytest.fixture
def two(streams: Any) -> tuple[Any, Any]:
    """Two brokers, each with stream queues `s` and `out`."""
    queues = {"s": stream(), "out": stream()}
    return streams.start(queues, name="a"), streams.start(queues, name="b")


def test_batch_read_takes_each_broker_s_stream_as_its_own_partitions(spark, two):
    a, b = two
    publish(a.url, "s", bodies("a", 30))
    publish(b.url, "s", bodies("b", 20))
    wait_stream(a, "s", 30)
    wait_stream(b, "s", 20)
    df = spark.read.format("scow").option("url", f"{a.url}, {b.url}").option("queues", "s").load()
    assert df.rdd.getNumPartitions() == 2
    rows = df.select("body", "sequence", "queue").collect()
    assert sorted(bytes(r.body).decode() for r in rows) == bodies("a", 30) + bodies("b", 20)
    assert {r.queue for r in rows} == {"s"}
    # offsets name the broker when there are several
    key_a, key_b = (f"127.0.0.1:{broker.port}/s" for broker in (a, b))
    tail = (
        spark.read.format("scow")
        .option("url", f"{a.url},{b.url}")
        .option("queues", "s")
        .option("startingOffsets", json.dumps({key_a: 25, key_b: 18}))
        .load()
    )
    assert sorted(bytes(r.body).decode() for r in tail.collect()) == (
        bodies("a", 5, 25) + bodies("b", 2, 18)
    )


def test_streaming_read_of_two_brokers_restarted_reads_each_message_once(
    spark, two, tmp_path: Path
):
    a, b = two
    publish(a.url, "s", bodies("a", 30))
    publish(b.url, "s", bodies("b", 20))
    wait_stream(a, "s", 30)
    wait_stream(b, "s", 20)

    def copy() -> Any:
        query = (
            spark.readStream.format("scow")
            .option("url", f"{a.url},{b.url}")
            .option("queues", "s")
            .option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", "20")
            .load()
            .select("body")
            .writeStream.format("scow")
            .option("url", a.url)
            .option("address", "out")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        return query

    query = copy()
    assert read_bodies(spark, a.url) == bodies("a", 30) + bodies("b", 20)
    offsets = query.lastProgress["sources"][0]["endOffset"]
    offsets = json.loads(offsets) if isinstance(offsets, str) else offsets
    assert offsets == {
        f"127.0.0.1:{a.port}/s": 30,
        f"127.0.0.1:{b.port}/s": 20,
    }
    publish(a.url, "s", bodies("a", 3, 30))
    publish(b.url, "s", bodies("b", 4, 20))
    wait_stream(a, "s", 33)
    wait_stream(b, "s", 24)
    copy()
    assert read_bodies(spark, a.url) == bodies("a", 33) + bodies("b", 24)


def test_batch_write_spreads_rows_by_key_column(spark, two):
    a, b = two
    rows = [(f"k{i % 7}", f"m{i:04d}") for i in range(140)]
    df = spark.createDataFrame(rows, "key string, body string").repartition(3)
    (
        df.write.format("scow")
        .option("url", f"{a.url},{b.url}")
        .option("address", "out")
        .option("keyColumn", "key")
        .mode("append")
        .save()
    )
    expected: dict[int, list[str]] = {0: [], 1: []}
    for key, body in rows:
        expected[zlib.crc32(key.encode()) % 2].append(body)
    assert expected[0] and expected[1]  # the keys do fall on both brokers
    assert read_bodies(spark, a.url) == sorted(expected[0])
    assert read_bodies(spark, b.url) == sorted(expected[1])


def test_streaming_write_takes_turns_over_brokers_and_commits_every_batch_on_each(
    spark, two, tmp_path: Path
):
    a, b = two
    publish(a.url, "s", bodies("m", 30))
    wait_stream(a, "s", 30)
    query = (
        spark.readStream.format("scow")
        .option("url", a.url)
        .option("queues", "s")
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "10")
        .load()
        .select("body")
        .writeStream.format("scow")
        .option("url", f"{a.url},{b.url}")
        .option("address", "out")
        .option("sinkId", "spread")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    on_a, on_b = read_bodies(spark, a.url), read_bodies(spark, b.url)
    # one partition per batch: batches 0 and 2 to the first broker, batch 1 to the second
    assert on_a == bodies("m", 10) + bodies("m", 10, 20)
    assert on_b == bodies("m", 10, 10)
    for broker in (a, b):
        assert management(broker.url, "stream-sink", "spread", "READ")["committed-batch"] == 2


def test_several_urls_are_checked(spark, two):
    from scow.plugins.spark.source import Options, ScowOptionError

    a, _b = two
    with pytest.raises(ScowOptionError, match=r"names broker 127\.0\.0\.1:\d+ twice"):
        Options.parse({"url": f"{a.url},{a.url}", "queues": "s"})
    with pytest.raises(ScowOptionError, match="host and port name one broker"):
        Options.parse({"url": f"{a.url},amqp://127.0.0.1:1", "port": "5672"})
    df = spark.createDataFrame([("x", "y")], "body string, k string")
    with pytest.raises(Exception, match="option keyColumn = 'key': no such column"):
        df.write.format("scow").option("url", a.url).option("keyColumn", "key").mode(
            "append"
        ).save()
