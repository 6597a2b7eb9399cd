"""Transactions found prepared at recovery are held undecided, then committed or undone."""

from __future__ import annotations

from pathlib import Path

import pytest
from proton import Message
from proton.utils import BlockingConnection

from scow.core.storage import StorageManager
from scow.core.testing import BrokerThread, broker_config, wait_for, write_config
from scow.plugins.file_journal.journal import FileJournal
from scow.plugins.file_journal.plugin import journal_settings
from scow.protocols.amqp.codec import encode_message
from tests.wire.helpers import consume_all

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]
TX = 990_000


def _broker(tmp_path: Path) -> BrokerThread:
    config = write_config(tmp_path / "scow.toml", broker_config(tmp_path / "data", plugins=PLUGINS))
    return BrokerThread(config).start()


def _bodies(broker: BrokerThread) -> list[str]:
    return [m.body for m in consume_all(broker.url, "prep")]


@pytest.fixture
def prepared_data_dir(tmp_path: Path) -> Path:
    """A data dir holding messages a and b and a prepared tx that adds c and acks a."""
    broker = _broker(tmp_path)
    conn = BlockingConnection(broker.url, timeout=10)
    sender = conn.create_sender("prep")
    for body in ("a", "b"):
        sender.send(Message(body=body, durable=True))
    conn.close()
    broker.stop()
    data = tmp_path / "data"
    storage = StorageManager(
        FileJournal(journal_settings(data, "bindings", {})),
        FileJournal(journal_settings(data, "messages", {})),
    )
    recovered = storage.load()
    queue_id = recovered.queues[0]["id"]
    first = recovered.messages[0]
    storage.store_message(
        storage.next_id(),
        "prep",
        0,
        4,
        [queue_id],
        encode_message("c", durable=True, body_kind="value"),
        None,
        tx_id=TX,
    )
    storage.acknowledge(first.id, queue_id, True, tx_id=TX)
    storage.messages.prepare(TX, b"xid", sync=True)
    storage.flush()
    storage.stop()
    return tmp_path


def test_prepared_transaction_is_held_then_committed(prepared_data_dir):
    broker = _broker(prepared_data_dir)
    try:
        assert list(broker.broker.prepared) == [TX]
        assert broker.queue_stats("prep")["message-count"] == 1  # a is held, c not yet visible
        broker.call(lambda: broker.broker.commit_prepared(TX))
        wait_for(lambda: broker.queue_stats("prep")["message-count"] == 2)
        assert _bodies(broker) == ["b", "c"]
    finally:
        broker.stop()


def test_prepared_transaction_rolled_back_gives_back_its_acks(prepared_data_dir):
    broker = _broker(prepared_data_dir)
    try:
        broker.call(lambda: broker.broker.rollback_prepared(TX))
        assert _bodies(broker) == ["a", "b"]
    finally:
        broker.stop()
