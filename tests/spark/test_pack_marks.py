"""A stream stores a committed pack as its rows only when the broker routed it whole
(`PackedRows`, a mark the journal keeps), never because of what a client's bytes hold:
a client's message that looks like a pack is one record, and a malformed pack fails
alone (a COMMIT refused, or the message dead-lettered), never wedging the stream."""

from __future__ import annotations

import re
from typing import Any

import pytest
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container

from scow.core.message import Message, PackedRows
from scow.core.testing import wait_for
from scow.plugins.spark.records import PACK_ANNOTATION, pack
from scow.protocols.amqp.codec import Symbol, UInt, encode_message
from tests.spark.conftest import client, stream, wait_stream

#: The annotation the broker once split a message by: what the review's client sent.
OLD_ROWS_ANNOTATION = "x-opt-scow-rows"


def looks_like_a_pack(annotation: str, *, durable: bool = False) -> bytes:
    """A client's message whose first annotation claims 1000 records, holding none."""
    return encode_message(
        b"hello", durable=durable, message_annotations={Symbol(annotation): UInt(1000)}
    )


def records_of(url: str, queue: str, count: int) -> list[bytes]:
    reader = client(url)
    try:
        return [m for batch in reader.read(queue, 0, count) for m in batch]
    finally:
        reader.close()


@pytest.mark.parametrize("annotation", [OLD_ROWS_ANNOTATION, PACK_ANNOTATION])
def test_a_message_a_client_sends_is_one_record_whatever_its_annotations_claim(
    streams, annotation
) -> None:
    broker = streams.start({"out": stream()})
    sender = client(broker.url)
    try:
        # each acknowledged once stored: the first one wedged the stream's writer before
        assert sender.send("out", [looks_like_a_pack(annotation)]) == 1
        assert sender.send("out", [encode_message(b"after")]) == 1
    finally:
        sender.close()
    wait_stream(broker, "out", 2)
    stats = broker.queue_stats("out")
    assert stats is not None
    assert (stats["messages-added"], stats["write-errors"]) == (2, 0)
    first, second = records_of(broker.url, "out", 2)
    assert first.endswith(b"hello") and second.endswith(b"after")


class _RawTransaction(MessagingHandler, TransactionHandler):
    """Sends encoded messages as they are in one AMQP transaction, then commits."""

    def __init__(self, url: str, address: str, messages: list[bytes]) -> None:
        super().__init__()
        self.url, self.address, self.messages = url, address, messages
        self.outcome: str | None = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url)
        self.sender = event.container.create_sender(self.conn, self.address)
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        for data in self.messages:
            event.transaction.send(self.sender, _Encoded(data))
        event.transaction.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self.outcome = "committed"
        self.conn.close()

    def on_transaction_aborted(self, event: Any) -> None:
        self.outcome = "aborted"
        self.conn.close()


class _Encoded:
    """A message already encoded: sent as its bytes (proton's `Sender.send` protocol)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def send(self, sender: Any, tag: Any = None) -> Any:
        delivery = sender.delivery(tag or sender.delivery_tag())
        sender.stream(self.data)
        sender.advance()
        return delivery


def test_a_transaction_s_lookalike_is_one_record_before_and_after_a_restart(streams) -> None:
    config = streams.config({"out": stream()})
    from scow.core.testing import BrokerThread

    broker = BrokerThread(config).start()
    try:
        handler = _RawTransaction(
            broker.url, "out", [looks_like_a_pack(OLD_ROWS_ANNOTATION, durable=True)]
        )
        Container(handler).run()
        assert handler.outcome == "committed"
        wait_stream(broker, "out", 1)
    finally:
        broker.stop()
    broker = BrokerThread(config).start()  # the journal had it: recovery hands it over again
    try:
        sender = client(broker.url)
        try:
            assert sender.send("out", [encode_message(b"after", durable=True)]) == 1
        finally:
            sender.close()
        wait_stream(broker, "out", 2)
        first, second = records_of(broker.url, "out", 2)
        assert first.endswith(b"hello") and second.endswith(b"after")
        stats = broker.queue_stats("out")
        assert stats is not None and stats["write-errors"] == 0
    finally:
        broker.stop()


def malformed_pack() -> bytes:
    """A durable pack whose count says 3 records, its data section holding 1."""
    good = pack([b"\x00\x53\x75\xa0\x01x"], durable=True)
    at = good.index(b"\x00\x53\x75\xb0") - 4
    return good[:at] + (3).to_bytes(4, "big") + good[at + 4 :]


def test_a_commit_of_a_malformed_staged_pack_is_refused_naming_its_staging_queue(
    streams,
) -> None:
    from scow.plugins.spark.client import ClientError

    broker = streams.start({"out": stream()})
    driver = client(broker.url)
    try:
        staging = driver.call(
            "stream-sink", "bad", "STAGE", {"batch": 0, "partition": 0, "attempt": 0, "to": "out"}
        )["address"]
        assert driver.send(staging, [malformed_pack()]) == 1
        refused = re.escape(staging) + ": .* malformed pack .*3 records"
        with pytest.raises(ClientError, match=refused):
            driver.call("stream-sink", "bad", "COMMIT", {"batch": 0}, [[0, 0]])
        assert driver.call("stream-sink", "bad", "READ")["committed-batch"] == -1
        assert driver.send("out", [encode_message(b"after")]) == 1  # the stream goes on
    finally:
        driver.close()
    wait_stream(broker, "out", 1)
    # back in staging: the refused commit's rollback puts it back after the answer (at
    # once on files; a database store takes a moment)
    wait_for(lambda: broker.queue_stats(staging)["message-count"] == 1, what="it back")


def test_a_malformed_pack_marked_for_a_stream_is_dead_lettered_alone(streams) -> None:
    broker = streams.start(
        {"out": stream(), "dla": {"routing-type": "ANYCAST"}},
        address_settings={"out": {"dead-letter-address": "dla"}},
    )

    def enqueue_marked() -> None:
        # as recovery would hand over a journal record of type PACKED_ROWS
        b = broker.broker
        message = Message(b.next_id(), PackedRows(malformed_pack()), "out", b.message_format)
        b.queues["out"].enqueue(message)

    broker.call(enqueue_marked)
    sender = client(broker.url)
    try:
        assert sender.send("out", [encode_message(b"after")]) == 1
    finally:
        sender.close()
    wait_stream(broker, "out", 1)
    assert records_of(broker.url, "out", 1)[0].endswith(b"after")
    assert broker.queue_stats("dla")["message-count"] == 1


@pytest.mark.parametrize("marked", [True, False])
def test_recovery_splits_a_pack_only_when_its_journal_record_says_it_was_routed_whole(
    streams, tmp_path, marked
) -> None:
    """A committed pack the journal still held at a crash (its stream had not stored it)
    is stored as its rows after a restart; the same bytes journaled as a message a
    client sent are one record."""
    from scow.core.storage import StorageManager
    from scow.core.testing import BrokerThread
    from scow.plugins.file_journal.journal import FileJournal
    from scow.plugins.file_journal.plugin import journal_settings

    config = streams.config({"out": stream()})
    BrokerThread(config).start().stop()  # creates the stream queue's record
    data = tmp_path / "data"
    storage = StorageManager(
        FileJournal(journal_settings(data, "bindings", {})),
        FileJournal(journal_settings(data, "messages", {})),
    )
    recovered = storage.load()
    (queue_id,) = [q["id"] for q in recovered.queues if q["name"] == "out"]
    rows = [encode_message(b"r%d" % n, durable=True) for n in range(3)]
    packed = pack(rows, durable=True)
    storage.store_message(
        storage.next_id(), "out", 0, 4, [queue_id], PackedRows(packed) if marked else packed, None
    )
    storage.flush()
    storage.stop()

    broker = BrokerThread(config).start()
    try:
        wait_stream(broker, "out", 3 if marked else 1)
        stored = records_of(broker.url, "out", 4)
        if marked:
            assert [r[-2:] for r in stored] == [b"r0", b"r1", b"r2"]
        else:
            assert len(stored) == 1 and stored[0].endswith(rows[-1])
    finally:
        broker.stop()
