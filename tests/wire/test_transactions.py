"""AMQP local transactions: declare, transactional send and accept, commit and rollback."""

from __future__ import annotations

from proton import Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

from scow.core.testing import wait_for

from .helpers import bulk_send, consume_all


class _TxHandler(MessagingHandler, TransactionHandler):
    """One transaction over `count` messages on `address`, then commit or abort."""

    def __init__(self, url: str, address: str, count: int, commit: bool) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.address, self.count, self.commit = url, address, count, commit
        self.outcome: str | None = None

    def on_start(self, event):
        self.conn = event.container.connect(self.url)
        self.open_link(event.container)
        event.container.declare_transaction(self.conn, handler=self)

    def discharge(self, transaction):
        if self.commit:
            transaction.commit()
        else:
            transaction.abort()

    def _finish(self, outcome: str) -> None:
        self.outcome = outcome
        self.conn.close()

    def on_transaction_committed(self, event):
        self._finish("committed")

    def on_transaction_aborted(self, event):
        self._finish("aborted")

    def on_transaction_declare_failed(self, event):
        self._finish("declare-failed")


class TxClient(_TxHandler):
    """Sends `count` messages in one transaction, then commits or aborts."""

    def open_link(self, container):
        self.sender = container.create_sender(self.conn, self.address)

    def on_transaction_declared(self, event):
        for i in range(self.count):
            event.transaction.send(self.sender, Message(body=f"tx{i}", durable=True))
        self.discharge(event.transaction)


class TxReceiver(_TxHandler):
    """Receives `count` messages and accepts them in one transaction, then discharges."""

    def __init__(self, url: str, address: str, count: int, commit: bool) -> None:
        super().__init__(url, address, count, commit)
        self.received: list[str] = []

    def open_link(self, container):
        self.receiver = container.create_receiver(self.conn, self.address)

    def on_transaction_declared(self, event):
        self.transaction = event.transaction
        self.receiver.flow(self.count)

    def on_message(self, event):
        self.received.append(event.message.body)
        self.transaction.accept(event.delivery)
        if len(self.received) == self.count:
            self.discharge(self.transaction)


def _drain(url: str, address: str) -> list[tuple[str, int]]:
    return [(m.body, m.delivery_count) for m in consume_all(url, address)]


def test_committed_sends_become_visible_and_rolled_back_ones_never(scow_broker):
    broker = scow_broker()
    committed = TxClient(broker.url, "txq", 3, commit=True)
    Container(committed).run()
    assert committed.outcome == "committed"
    aborted = TxClient(broker.url, "txq", 2, commit=False)
    Container(aborted).run()
    assert aborted.outcome == "aborted"
    assert [body for body, _ in _drain(broker.url, "txq")] == ["tx0", "tx1", "tx2"]


def test_sends_are_invisible_until_commit(scow_broker):
    broker = scow_broker()
    conn = BlockingConnection(broker.url, timeout=10)
    try:
        conn.create_receiver("txq2")  # creates the queue
        client = TxClient(broker.url, "txq2", 2, commit=False)
        Container(client).run()
        wait_for(lambda: broker.queue_stats("txq2") is not None)
        assert broker.queue_stats("txq2")["message-count"] == 0
    finally:
        conn.close()


def test_rolled_back_acknowledgements_return_messages_with_a_higher_count(scow_broker):
    broker = scow_broker()
    conn = BlockingConnection(broker.url, timeout=10)
    sender = conn.create_sender("acks")
    for i in range(2):
        sender.send(Message(body=f"a{i}"))
    conn.close()
    rolled = TxReceiver(broker.url, "acks", 2, commit=False)
    Container(rolled).run()
    assert rolled.outcome == "aborted" and rolled.received == ["a0", "a1"]
    assert _drain(broker.url, "acks") == [("a0", 1), ("a1", 1)]


def test_a_large_rollback_puts_every_message_back_in_order_before_those_still_waiting(
    scow_broker,
):
    # thousands released at once, behind which more wait: merged back in one pass
    broker = scow_broker()
    bulk_send(broker.url, "many", 3000, lambda i: Message(body=f"m{i}", durable=True))
    rolled = TxReceiver(broker.url, "many", 2500, commit=False)
    Container(rolled).run()
    assert rolled.outcome == "aborted" and len(rolled.received) == 2500
    assert _drain(broker.url, "many") == [(f"m{i}", 1 if i < 2500 else 0) for i in range(3000)]


def test_committed_acknowledgements_remove_the_messages(scow_broker):
    broker = scow_broker()
    conn = BlockingConnection(broker.url, timeout=10)
    sender = conn.create_sender("acks2")
    for i in range(3):
        sender.send(Message(body=f"b{i}"))
    conn.close()
    committed = TxReceiver(broker.url, "acks2", 3, commit=True)
    Container(committed).run()
    assert committed.outcome == "committed"
    wait_for(
        lambda: (
            broker.queue_stats("acks2") is None or broker.queue_stats("acks2")["message-count"] == 0
        )
    )


class Abandoner(TxReceiver):
    """Accepts in a transaction, then drops the connection without discharging."""

    def on_message(self, event):
        self.received.append(event.message.body)
        self.transaction.accept(event.delivery)
        if len(self.received) == self.count:
            self.transaction.send(self.sender, Message(body="never", durable=True))
            event.connection.close()
            self.outcome = "abandoned"

    def on_transaction_declared(self, event):
        self.sender = event.container.create_sender(self.conn, "abandoned-sends")
        super().on_transaction_declared(event)


def test_connection_loss_rolls_back_its_open_transaction(scow_broker):
    broker = scow_broker()
    conn = BlockingConnection(broker.url, timeout=10)
    conn.create_sender("held").send(Message(body="h"))
    conn.close()
    client = Abandoner(broker.url, "held", 1, commit=True)
    Container(client).run()
    assert client.outcome == "abandoned"
    assert _drain(broker.url, "held") == [("h", 1)]  # the ack was rolled back: +1 count
    assert _drain(broker.url, "abandoned-sends") == []
