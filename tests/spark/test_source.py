"""The `scow` PySpark data source against a real broker, on one local[2] SparkSession."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from scow.core.testing import wait_for
from tests.spark.conftest import client, management, publish, stream, wait_stream

pytestmark = pytest.mark.spark


def bodies(n: int, start: int = 0) -> list[str]:
    return [f"m{i:05d}" for i in range(start, start + n)]


def read(spark, url: str, **options: str):
    reader = spark.read.format("scow").option("url", url)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def stream_reader(spark, url: str, **options: str):
    reader = spark.readStream.format("scow").option("url", url)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_of_a_range_in_partitions(spark, streams):
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", bodies(100), app=lambda b: {"odd": int(b[1:]) % 2})
    wait_stream(broker, "s", 100)
    df = read(
        spark,
        broker.url,
        queues="s",
        startingOffsets='{"s": 10}',
        endingOffsets='{"s": 60}',
        maxMessagesPerPartition="20",
    )
    assert df.rdd.getNumPartitions() == 3
    rows = df.select(
        "sequence",
        "body",
        "body_type",
        "queue",
        "properties.message_id",
        "application_properties",
        "enqueued_time",
    ).collect()
    assert [r.sequence for r in rows] == list(range(10, 60))
    assert [bytes(r.body).decode() for r in rows] == bodies(50, 10)
    assert {r.body_type for r in rows} == {"data"} and {r.queue for r in rows} == {"s"}
    assert [r.message_id for r in rows] == bodies(50, 10)
    assert rows[1].application_properties == {"odd": "1"}
    assert rows[0].enqueued_time is not None
    selected = read(spark, broker.url, queues="s", selector="odd = 1", minPartitions="3")
    assert selected.count() == 50
    stamp = int(time.time() * 1000) + 1
    time.sleep(0.01)
    publish(broker.url, "s", bodies(20, 100))
    wait_stream(broker, "s", 120)
    assert read(spark, broker.url, queues="s").count() == 120
    late = read(spark, broker.url, queues="s", startingTimestamp=str(stamp)).collect()
    assert sorted(r.sequence for r in late) == list(range(100, 120))


def test_every_body_kind_is_read(spark, streams):
    from scow.protocols.amqp.codec import encode_message

    broker = streams.start({"s": stream()})
    c = client(broker.url)
    c.send(
        "s",
        [
            encode_message("text", body_kind="value"),
            encode_message({"k": 1}, body_kind="value"),
            encode_message([1, 2], body_kind="sequence"),
            encode_message(b"raw"),
        ],
    )
    c.close()
    wait_stream(broker, "s", 4)
    rows = read(spark, broker.url, queues="s").orderBy("sequence").collect()
    assert [r.body_type for r in rows] == ["string", "value", "sequence", "data"]
    assert bytes(rows[0].body) == b"text" and bytes(rows[3].body) == b"raw"
    assert bytes(rows[1].body)[0] in (0xC1, 0xD1)  # an AMQP map


def test_unknown_option_is_rejected_listing_the_valid_ones(spark, streams):
    broker = streams.start({"s": stream()})
    with pytest.raises(Exception, match=r"unknown option 'queus'.*valid: url, host, port"):
        read(spark, broker.url, queus="s").count()


def _query(df, checkpoint: Path, out: Path, **trigger):
    return (
        df.select("sequence", "body")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def test_streaming_read_stopped_between_batches_and_restarted_reads_each_message_once(
    spark, streams, tmp_path
):
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", bodies(300))
    wait_stream(broker, "s", 300)
    options = {
        "queues": "s",
        "startingOffsets": "earliest",
        "maxMessagesPerTrigger": "100",
        "cursor": "copy",
    }
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    query = _query(
        stream_reader(spark, broker.url, **options),
        checkpoint,
        out,
        processingTime="100 milliseconds",
    )
    wait_for(
        lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 200,
        timeout=60,
        what="two micro-batches",
    )
    query.stop()  # between (or in) batches: the checkpoint decides what was done
    publish(broker.url, "s", bodies(200, 300))
    wait_stream(broker, "s", 500)
    query = _query(stream_reader(spark, broker.url, **options), checkpoint, out, availableNow=True)
    query.awaitTermination(120)
    rows = spark.read.parquet(str(out)).collect()
    sequences = sorted(r.sequence for r in rows)
    assert sequences == list(range(500))  # every message, none twice
    cursor = management(broker.url, "stream", "s", "CURSOR-READ", cursor="copy")
    # commit moved the broker cursor (Spark commits a batch's end when the next starts, so
    # the last batch of an AvailableNow run may be left to the next run)
    assert cursor["sequence"] in (400, 500)


def test_failure_inside_a_batch_replays_identical_messages(spark, streams, tmp_path):
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", bodies(150))
    wait_stream(broker, "s", 150)
    log, fail_once = tmp_path / "seen.jsonl", tmp_path / "failed"

    def record(batch, batch_id: int) -> None:
        sequences = sorted(r.sequence for r in batch.select("sequence").collect())
        with open(log, "a") as f:
            f.write(json.dumps([batch_id, sequences]) + "\n")
        if batch_id == 1 and not fail_once.exists():
            fail_once.touch()
            raise RuntimeError("injected failure inside batch 1")

    def run():
        return (
            stream_reader(
                spark,
                broker.url,
                queues="s",
                startingOffsets="earliest",
                maxMessagesPerTrigger="50",
            )
            .writeStream.foreachBatch(record)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    with pytest.raises(Exception, match="injected failure"):
        run().awaitTermination(120)
    run().awaitTermination(120)
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    attempts = [s for b, s in seen if b == 1]
    assert len(attempts) == 2 and attempts[0] == attempts[1] == list(range(50, 100))
    done = sorted(q for b, s in seen for q in s if not (b == 1 and s is attempts[0]))
    assert done == list(range(150))


def test_fail_on_data_loss_names_the_missing_range(spark, streams, tmp_path):
    broker = streams.start({"s": stream(**{"segment-bytes": 1500, "retention-bytes": 3000})})
    publish(broker.url, "s", bodies(10))
    wait_stream(broker, "s", 10)
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    options = {"queues": "s", "startingOffsets": "earliest"}
    _query(
        stream_reader(spark, broker.url, **options), checkpoint, out, availableNow=True
    ).awaitTermination(120)
    publish(broker.url, "s", [b + "x" * 200 for b in bodies(100, 10)])  # retention passes 10
    wait_stream(broker, "s", 110)
    first = management(broker.url, "stream", "s", "READ")["first-sequence"]
    assert first > 10
    query = _query(stream_reader(spark, broker.url, **options), checkpoint, out, availableNow=True)
    with pytest.raises(Exception, match=rf"messages 10 to {first - 1} of queue 's' are gone"):
        query.awaitTermination(120)
    lenient = {**options, "failOnDataLoss": "false"}
    _query(
        stream_reader(spark, broker.url, **lenient), checkpoint, out, availableNow=True
    ).awaitTermination(120)
    sequences = sorted(r.sequence for r in spark.read.parquet(str(out)).collect())
    assert sequences == list(range(10)) + list(range(first, 110))


def test_available_now_with_max_messages_per_trigger(spark, streams, tmp_path):
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", bodies(1000))
    wait_stream(broker, "s", 1000)
    df = stream_reader(
        spark, broker.url, queues="s", startingOffsets="earliest", maxMessagesPerTrigger="300"
    )
    query = _query(df, tmp_path / "checkpoint", tmp_path / "out", availableNow=True)
    query.awaitTermination(120)
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [
        300,
        300,
        300,
        100,
    ]


def test_max_bytes_per_trigger_limits_micro_batches(spark, streams, tmp_path):
    broker = streams.start({"s": stream()})
    publish(broker.url, "s", bodies(600))
    wait_stream(broker, "s", 600)
    state = management(broker.url, "stream", "s", "READ")
    per = state["stored-bytes"] / state["message-count"]
    df = stream_reader(spark, broker.url, queues="s", startingOffsets="earliest",
                       maxBytesPerTrigger=str(int(per * 250)))  # fmt: skip
    query = _query(df, tmp_path / "checkpoint", tmp_path / "out", availableNow=True)
    query.awaitTermination(120)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 600 and len(sizes) == 3 and max(sizes) <= 250


def test_streaming_write_killed_mid_batch_and_restarted_writes_each_row_once(
    spark, streams, tmp_path
):
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    broker = streams.start({"in": stream(), "out": stream()})
    publish(broker.url, "in", bodies(200))
    wait_stream(broker, "in", 200)
    flag = str(tmp_path / "crashed")

    @F.udf(BinaryType(), useArrow=False)
    def crash_once(body: bytes) -> bytes:
        import os

        if body.endswith(b"150") and not os.path.exists(flag):
            open(flag, "w").close()
            raise RuntimeError("task killed mid-batch")
        return body

    def run():
        return (
            stream_reader(
                spark, broker.url, queues="in", startingOffsets="earliest", minPartitions="2"
            )
            .select(crash_once("body").alias("body"))
            .writeStream.format("scow")
            .option("url", broker.url)
            .option("address", "out")
            .option("sinkId", "copy")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    with pytest.raises(Exception, match="task killed mid-batch"):
        run().awaitTermination(120)
    assert broker.queue_stats("out")["next-sequence"] == 0  # nothing of the batch visible
    run().awaitTermination(120)
    wait_stream(broker, "out", 200)
    rows = read(spark, broker.url, queues="out").collect()
    assert sorted(bytes(r.body).decode() for r in rows) == bodies(200)  # none twice
    assert not [n for n in broker.call(lambda: list(broker.broker.queues)) if "staging" in n]


def test_broker_restarted_under_a_running_query_loses_nothing(spark, streams, tmp_path, port):
    broker = streams.start({"s": stream()}, port=port)
    publish(broker.url, "s", bodies(100))
    wait_stream(broker, "s", 100)
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    options = {"queues": "s", "startingOffsets": "earliest", "timeout": "5"}
    query = _query(
        stream_reader(spark, broker.url, **options),
        checkpoint,
        out,
        processingTime="100 milliseconds",
    )
    wait_for(lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 100, timeout=60)
    broker.stop()
    publish_error = None
    try:  # the query either fails naming the broker connection, or waits and resumes
        query.awaitTermination(3)
    except Exception as exc:
        publish_error = str(exc)
    if publish_error is not None:
        assert "broker" in publish_error or "connect" in publish_error
    broker = streams.start({"s": stream()}, port=port)
    publish(broker.url, "s", bodies(100, 100))
    wait_stream(broker, "s", 200)
    if query.isActive:
        query.stop()
    query = _query(stream_reader(spark, broker.url, **options), checkpoint, out, availableNow=True)
    query.awaitTermination(120)
    sequences = sorted(r.sequence for r in spark.read.parquet(str(out)).collect())
    assert sequences == list(range(200))


def test_batch_write_is_visible_at_once(spark, streams):
    broker = streams.start({"out": stream()})
    df = spark.createDataFrame(
        [(b"a", None, {"k": "1"}, {"message_id": "id-a"}), (b"b", "out", None, None)],
        "body binary, subject string, application_properties map<string,string>, "
        "properties struct<message_id: string>",
    )
    df.write.format("scow").option("url", broker.url).option("address", "out").mode("append").save()
    rows = read(spark, broker.url, queues="out").orderBy("sequence").collect()
    assert [bytes(r.body) for r in rows] == [b"a", b"b"]
    assert rows[0].application_properties == {"k": "1"} and rows[1].properties.subject == "out"
    assert rows[0].properties.message_id == "id-a"


def test_a_stream_reader_ships_to_executors_without_its_driver_connection(spark, streams):
    import pickle

    from scow.plugins.spark.source import ScowDataSource

    broker = streams.start({"s": stream()})
    publish(broker.url, "s", bodies(5))
    wait_stream(broker, "s", 5)
    reader = ScowDataSource({"url": broker.url, "queues": "s"}).streamReader(None)
    assert reader.initialOffset() == {"s": 5}  # opens the driver's connection
    connection = reader._clients[0]
    assert not connection.closed
    shipped = pickle.loads(pickle.dumps(reader))  # a live socket would not pickle
    assert shipped._clients == {} and shipped.options == reader.options
    assert reader.initialOffset() == {"s": 5}
    assert reader._clients[0] is connection and not connection.closed  # one connection, kept
