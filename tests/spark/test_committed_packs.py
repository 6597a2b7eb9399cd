"""A sink's staged pack committed whole to a stream (`PackedRows`): one journal
record and one store append for its rows, each row still a record of its own with its
own sequence number; after a crash, recovery appends only the rows the store lacks."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from scow.plugins.spark.records import annotate, pack, row_id
from scow.plugins.spark.segments import open_store
from scow.plugins.spark.stream import stored_rows
from scow.plugins.spark.writer import StreamWriter, Written
from tests.spark.conftest import client, stream, stream_bodies, wait_stream

ROWS = [b"\x00\x53\x75\xa0\x02r%d" % i for i in range(5)]  # data sections: bodies r0..r4


def test_a_committed_pack_is_stored_as_its_rows_from_a_given_one_in_one_append(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path, "s", 1 << 20, {})
    store.open()
    written: list[Written] = []
    done = threading.Event()

    def on_written(batch: Written) -> None:
        written.append(batch)
        done.set()

    writer = StreamWriter(store, tmp_path, on_written, annotate)
    # rows 0 and 1 were stored before
    writer.append_rows(7, 42, pack(ROWS, durable=True), 2, "token")
    assert done.wait(10)
    writer.close()
    assert [(w.last_seq, w.tokens) for w in written] == [(9, ["token"])]
    records, _next = store.read(0, 100, 100)
    assert [seq for seq, _time, _data in records] == [7, 8, 9]
    assert all(data.endswith(row) for (_s, _t, data), row in zip(records, ROWS[2:], strict=True))

    reopened = open_store(tmp_path, "s", 1 << 20, {}).open()
    assert reopened.recent_ids == {row_id(42, n) for n in (2, 3, 4)}
    assert reopened.next_seq == 10


def test_recovery_skips_the_rows_of_a_pack_a_crash_left_stored() -> None:
    stored = {row_id(42, 0), row_id(42, 1), row_id(7, 0), 42}
    assert stored_rows(stored, 42, 5) == 2
    assert stored == {row_id(7, 0), 42}  # only those two were taken
    assert stored_rows(stored, 7, 1) == 1  # all of a pack: only its acknowledgement is due
    assert stored_rows(set(), 9, 3) == 0
    assert row_id(42, 0) != row_id(41, 1) and row_id(42, 0) >= 1 << 63


@pytest.mark.parametrize("queues", [["out"], ["out", "plain"]])
def test_a_commit_writes_every_row_once_in_order_to_a_stream_or_as_single_messages(
    streams, queues: list[str]
) -> None:
    pa = pytest.importorskip("pyarrow")
    from scow.plugins.spark.source import Options, commit, stage

    broker = streams.start({"out": stream()})
    if "plain" in queues:  # a standard queue beside the stream: the rows go one by one
        broker.call(
            lambda: broker.broker.declare_queue("plain", address="out", routing_type="MULTICAST")
        )
    options = Options.parse({"url": broker.url, "address": "out"})
    bodies = [b"r%05d" % i for i in range(3000)]  # several packs, more than a slice
    batch = pa.RecordBatch.from_arrays([pa.array(bodies)], ["body"])
    commit(options, "sink", 0, [stage(options, "sink", 0, iter([batch]))])
    wait_stream(broker, "out", len(bodies))
    assert stream_bodies(broker.url, "out", len(bodies)) == bodies
    if "plain" in queues:
        assert broker.queue_stats("plain")["message-count"] == len(bodies)


def test_a_packs_duplicate_ids_are_read_as_the_message_format_reads_them() -> None:
    pa = pytest.importorskip("pyarrow")
    from scow.core.duplicates import id_key
    from scow.plugins.spark.schema import messages_of
    from scow.plugins.spark.staging import _StagedRows
    from scow.protocols.amqp.codec import encode_message
    from scow.protocols.amqp.format import AMQP_FORMAT

    bodies = pa.RecordBatch.from_arrays([pa.array([b"a", b"b" * 300])], ["body"])
    rows = [
        *messages_of(bodies, "sink:3:1:"),  # the connector's rows: read at a fixed place
        *messages_of(bodies, "x" * 300),  # a long id (map32): parsed
        encode_message(b"c", durable=True, application_properties={"k": 1}),  # none
        encode_message(b"d", durable=True, application_properties={"_AMQ_DUPL_ID": b"\xff"}),
        encode_message(b"e", durable=True, application_properties={"_AMQ_DUPL_ID": "é"}),
    ]
    staged = _StagedRows(pack(rows, durable=True), AMQP_FORMAT, "out", "staging")
    found = [value for row in rows if (value := AMQP_FORMAT.inspect(row)[3]) is not None]
    expected = [v if v.__class__ is bytes else id_key(v, "out") for v in found]
    assert staged.duplicate_keys() == expected
    assert len(expected) == 6 and staged.rows == 7


def test_a_commit_whose_pack_repeats_an_admitted_id_is_refused_and_writes_nothing(
    streams,
) -> None:
    pa = pytest.importorskip("pyarrow")
    from scow.plugins.spark.client import ClientError
    from scow.plugins.spark.schema import messages_of
    from scow.plugins.spark.source import Options, commit, duplicate_ids, stage

    broker = streams.start({"out": stream()})
    options = Options.parse({"url": broker.url, "address": "out"})
    batch = pa.RecordBatch.from_arrays([pa.array([b"r%d" % i for i in range(3000)])], ["body"])
    # row 2500 of the batch reached the address before (as a replay past the marker would)
    sender = client(broker.url)
    try:
        one = batch.slice(2500, 1)
        assert sender.send("out", messages_of(one, duplicate_ids("sink", 0, 0), 2500)) == 1
    finally:
        sender.close()
    staged = stage(options, "sink", 0, iter([batch]))
    with pytest.raises(ClientError, match="sink:0:0:2500"):
        commit(options, "sink", 0, [staged])
    assert broker.queue_stats("out")["next-sequence"] == 1  # only the one sent before


def test_a_pack_goes_as_rows_once_a_send_before_it_in_the_commit_created_a_plain_queue(
    streams,
) -> None:
    """Whether a pack goes whole is decided when it is routed: here the commit's first
    send (a row staged on its own) auto-creates a standard queue on the address, which
    then gets the pack's rows one by one, as the stream gets them as records."""
    from scow.core.model import RoutingType
    from scow.protocols.amqp.codec import encode_message

    broker = streams.start({})

    def two_routing_types() -> None:
        b = broker.broker
        b.create_address("out", {RoutingType.ANYCAST, RoutingType.MULTICAST})
        b.declare_queue(
            "copy", address="out", routing_type="MULTICAST", arguments={"x-queue-type": "stream"}
        )

    broker.call(two_routing_types)
    driver = client(broker.url)
    try:
        staging = driver.call(
            "stream-sink", "s", "STAGE", {"batch": 0, "partition": 0, "attempt": 0, "to": "out"}
        )["address"]
        rows = [encode_message(b"p%d" % n, durable=True) for n in range(3)]
        sent = driver.send(
            staging, [encode_message(b"alone", durable=True), pack(rows, durable=True)]
        )
        assert sent == 2
        driver.call("stream-sink", "s", "COMMIT", {"batch": 0}, [[0, 0]])
    finally:
        driver.close()
    wait_stream(broker, "copy", 4)
    assert broker.queue_stats("out")["message-count"] == 4  # the standard queue: 4 messages
    assert broker.queue_stats("copy")["next-sequence"] == 4


def test_a_committed_pack_is_not_searched_for_a_duplicate_id_of_its_own(streams) -> None:
    """A commit reads a pack's header from its header alone: the message format's
    id-layout cache (producers' messages) gets nothing of it."""
    pa = pytest.importorskip("pyarrow")
    from scow.plugins.spark.records import DURABLE_HEADER, PACK_PREFIX
    from scow.plugins.spark.source import Options, commit, stage

    broker = streams.start({"out": stream()})
    options = Options.parse({"url": broker.url, "address": "out"})
    batch = pa.RecordBatch.from_arrays([pa.array([b"r%d" % i for i in range(10)])], ["body"])
    staged = stage(options, "ids", 0, iter([batch]))
    fmt = broker.call(lambda: broker.broker.message_format)
    broker.call(fmt._id_layouts.clear)  # what staging's sends put there
    commit(options, "ids", 0, [staged])
    wait_stream(broker, "out", 10)
    layouts = broker.call(lambda: list(fmt._id_layouts))
    assert not [p for p in layouts if p.startswith(DURABLE_HEADER + PACK_PREFIX)]
