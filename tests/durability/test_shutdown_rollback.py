"""A broker stopped (SIGTERM) while a connection holds a transaction that accepted many
messages: closing the connection rolls it back, a slice per pass of the loop
(`Broker.rollback`), and every slice is journaled before storage stops, so after a
restart each of those messages comes back once with its failed delivery counted."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container

from scow.core.broker import COMMIT_SLICE
from scow.core.testing import broker_processes
from tests.wire.helpers import bulk_send, consume_all

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]


class _HeldTransaction(MessagingHandler, TransactionHandler):
    """Receives `count` messages and accepts them in a transaction it never discharges;
    `accepted` is set once all are, and the connection stays open until the broker goes."""

    def __init__(self, url: str, address: str, count: int) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.count = url, address, count
        self.received = 0
        self.accepted = threading.Event()

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, reconnect=False)
        self.receiver = event.container.create_receiver(self.conn, self.address)
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.receiver.flow(self.count)

    def on_message(self, event: Any) -> None:
        self.transaction.accept(event.delivery)
        self.received += 1
        if self.received == self.count:
            self.accepted.set()

    def on_transport_error(self, event: Any) -> None:
        if event.connection is not None:  # none once the broker has gone
            event.connection.close()

    def on_disconnected(self, event: Any) -> None:
        event.container.stop()


# More slices than the loop passes of a shutdown from the connections' close to storage's
# stop (about 6 with these plugins: 4 slices finished within them, and the test passed
# without `finish_rollbacks`); 10 leave some to run while storage stops, 20 a wider margin
@pytest.mark.parametrize("slices", [10, pytest.param(20, marks=pytest.mark.slow, id="20")])
def test_a_rollback_under_way_at_shutdown_is_journaled_before_storage_stops(
    tmp_path: Path, slices: int
) -> None:
    count = slices * COMMIT_SLICE
    with broker_processes(tmp_path) as start:  # the broker's log: tmp_path / "broker.log"
        broker = start(plugins=PLUGINS)
        bulk_send(broker.url, "held", count, lambda i: Message(body=f"m{i}", durable=True))
        held = _HeldTransaction(broker.url, "held", count)
        container = Container(held)
        running = threading.Thread(target=container.run, daemon=True)
        running.start()
        assert held.accepted.wait(120), f"{held.received} of {count} received"
        assert broker.stop() == 0  # the connection closes: its transaction rolls back
        running.join(10)
        broker.start()
        counts = [(m.body, m.delivery_count) for m in consume_all(broker.url, "held")]
        assert broker.stop() == 0  # the restarted one's stop is in the log too
    assert len(counts) == count
    assert {c for _body, c in counts} == {1}, sorted({c for _b, c in counts})
    assert "Traceback" not in (tmp_path / "broker.log").read_text()
