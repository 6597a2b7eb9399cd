"""A broker stopped (SIGTERM) while a large transaction's commit runs a slice per pass of
the loop (`Broker.commit`: `_SlicedCommit`): the commit ends before storage stops
(`Broker.finish_commits`), so after a restart it is all there or not at all: its sends
all in their queue or none, the messages it accepted all gone or all back once, each with
its failed delivery counted. Nothing is lost or doubled."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container

from scow.core.broker import COMMIT_SLICE
from scow.core.testing import broker_processes, wait_for
from scow.plugins.spark.client import Client, Endpoint
from tests.wire.helpers import bulk_send, consume_all

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]


class _CommittingTransaction(MessagingHandler, TransactionHandler):
    """In one transaction, accepts `taken` messages of `source` and sends `sends` to
    `target`, then commits; `committing` is set once the commit is asked."""

    def __init__(self, url: str, source: str, taken: int, target: str, sends: int) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url, self.source, self.taken = url, source, taken
        self.target, self.sends = target, sends
        self.received = self.sent = 0
        self.transaction: Any = None
        self.committing = threading.Event()
        self.outcome: str | None = None

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url, reconnect=False)
        self.receiver = event.container.create_receiver(self.conn, self.source)
        self.sender = event.container.create_sender(self.conn, self.target)
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        if self.taken:
            self.receiver.flow(self.taken)
        self._send()

    def on_message(self, event: Any) -> None:
        self.transaction.accept(event.delivery)
        self.received += 1
        if self.received == self.taken:
            self._send()

    def on_sendable(self, event: Any) -> None:
        self._send()

    def _send(self) -> None:
        if self.transaction is None or self.received < self.taken or self.committing.is_set():
            return
        while self.sender.credit and self.sent < self.sends:
            self.transaction.send(self.sender, Message(body=f"s{self.sent}", durable=True))
            self.sent += 1
        if self.sent == self.sends:
            self.transaction.commit()
            self.committing.set()

    def on_transaction_committed(self, event: Any) -> None:
        self.outcome = "committed"

    def on_transaction_failed(self, event: Any) -> None:
        self.outcome = "failed"

    def on_transport_error(self, event: Any) -> None:
        self.conn.close()

    def on_disconnected(self, event: Any) -> None:
        event.container.stop()


def messages_in_memory(client: Client, address: str) -> int:
    """What `address` holds, counted as its messages are stored: a commit's before any
    is in its queue."""
    return int(client.call("address", address, "READ", {})["messages-in-memory"])


def test_a_commit_under_way_at_shutdown_is_all_or_nothing_after_a_restart(
    tmp_path: Path,
) -> None:
    # its slices outlast the loop passes from the stop signal to storage's stop
    taken, sends = 100, 16 * COMMIT_SLICE
    with broker_processes(tmp_path) as start:  # the broker's log: tmp_path / "broker.log"
        broker = start(plugins=PLUGINS)
        bulk_send(broker.url, "held", taken, lambda i: Message(body=f"h{i}", durable=True))
        bulk_send(broker.url, "out", 1, lambda i: Message(body="x", durable=True))  # declared
        tx = _CommittingTransaction(broker.url, "held", taken, "out", sends)
        container = Container(tx)
        running = threading.Thread(target=container.run, daemon=True)
        running.start()
        assert tx.committing.wait(120), f"{tx.received} received, {tx.sent} sent"
        # its first slice is stored (the address counts it) and it is not answered yet
        manager = Client(Endpoint.parse(broker.url, timeout=10))
        wait_for(lambda: messages_in_memory(manager, "out") > 1, what="the commit under way")
        assert tx.outcome is None, "the commit was over before the broker stopped"
        assert broker.stop() == 0
        manager.close()
        running.join(10)
        broker.start()
        out = [m.body for m in consume_all(broker.url, "out")]
        held = [(m.body, m.delivery_count) for m in consume_all(broker.url, "held")]
        assert broker.stop() == 0  # the restarted one's stop is in the log too
    log = (tmp_path / "broker.log").read_text()
    assert "Traceback" not in log
    sent = [f"s{i}" for i in range(sends)]
    if len(out) > 1:  # committed: every send once, every accepted message gone
        assert sorted(out) == sorted(["x", *sent]) and held == []
    else:  # undone: no send, every accepted message back once, its delivery counted
        assert out == ["x"]
        assert sorted(held) == sorted((f"h{i}", 1) for i in range(taken))


def test_a_commit_making_its_messages_visible_at_shutdown_enqueues_the_rest_at_once(
    scow_broker,
) -> None:
    """`finish_commits` reached while a committed transaction's messages go into their
    queue a slice per pass: the rest go in at once (each once: the queue holds them all
    as `finish_commits` returns), and its client is answered."""
    broker = scow_broker(plugins=PLUGINS)
    sends = 4 * COMMIT_SLICE
    found: list[tuple[int, int, int]] = []  # (enqueued at the hold, then, commits left)

    def hold() -> None:  # once per pass of the loop until the enqueueing is half way
        b = broker.broker
        enqueuing = [c for c in b.commits if c.committed and c.handle is not None]
        if not enqueuing or enqueuing[0].enqueued < 2 * COMMIT_SLICE:
            broker.loop.call_soon(hold)
            return
        at_hold = enqueuing[0].enqueued

        async def finish() -> None:
            await b.finish_commits()
            found.append((at_hold, b.queues["out"].stats()["message-count"], len(b.commits)))

        broker.loop.create_task(finish())

    bulk_send(broker.url, "out", 1, lambda i: Message(body="x", durable=True))  # declared
    broker.loop.call_soon_threadsafe(hold)
    tx = _CommittingTransaction(broker.url, "held", 0, "out", sends)
    container = Container(tx)
    running = threading.Thread(target=container.run, daemon=True)
    running.start()
    try:
        wait_for(lambda: tx.outcome is not None, 60, what="the commit's outcome")
    finally:
        tx.conn.close()
        running.join(10)
    assert tx.outcome == "committed"
    ((at_hold, in_queue, left),) = found
    assert at_hold < sends and (in_queue, left) == (1 + sends, 0)
