"""A large transaction's commit is done a slice per pass of the broker's loop: other
connections are served while it proceeds, and a failure in a later slice rolls back the
whole transaction.

`COMMIT_SLICE` is lowered here so that a few thousand messages (a second of a proton
client's sending) make a commit of hundreds of passes.
"""

from __future__ import annotations

import threading

import pytest
from proton import Message
from proton.reactor import Container
from proton.utils import BlockingConnection

from scow.core import broker as broker_module
from scow.core.duplicates import DUPLICATE_ID_PROPERTY
from scow.core.testing import wait_for

from .helpers import consume_all
from .test_transactions import TxClient, TxReceiver

COUNT = 3000


@pytest.fixture
def small_slices(monkeypatch):
    monkeypatch.setattr(broker_module, "COMMIT_SLICE", 1)


class Committing:
    """`client` run on a thread of its own (its container's loop)."""

    def __init__(self, client: TxClient | TxReceiver) -> None:
        self.client = client
        self.thread = threading.Thread(target=Container(client).run, daemon=True)
        self.thread.start()

    def join(self) -> str | None:
        self.thread.join(30)
        assert not self.thread.is_alive(), "the transaction's client did not finish"
        return self.client.outcome


class TxBulk(TxClient):
    """Sends `count` messages in one transaction as credit comes (more than a link's
    credit), and discharges it once the broker has taken every one."""

    transaction = None
    sent = settled = 0

    def message(self, i: int) -> Message:
        return Message(body=f"tx{i}", durable=True)

    def on_transaction_declared(self, event):
        self.transaction = event.transaction
        self.on_sendable(event)

    def on_sendable(self, event):
        while self.transaction is not None and self.sender.credit and self.sent < self.count:
            self.transaction.send(self.sender, self.message(self.sent))
            self.sent += 1

    def on_settled(self, event):
        self.settled += 1
        if self.settled == self.count:
            self.discharge(self.transaction)

    def on_transaction_commit_failed(self, event):
        self._finish("commit-failed")


class TxDuplicates(TxBulk):
    """The first and the last message carry the same duplicate id."""

    def message(self, i: int) -> Message:
        message = super().message(i)
        if i in (0, self.count - 1):
            message.properties = {DUPLICATE_ID_PROPERTY: "twice"}
        return message


def test_another_connection_is_served_while_a_large_commit_is_routed(scow_broker, small_slices):
    thread = scow_broker()
    broker = thread.broker
    ping = BlockingConnection(thread.url, timeout=10)
    sender = ping.create_sender("ping")
    sender.send(Message(body="warm"))  # connected and attached before the commit starts
    before = thread.call(lambda: broker.messages_routed)
    committing = Committing(TxBulk(thread.url, "big", COUNT, commit=True))

    def routing_part_of_it() -> bool:
        routed = thread.call(lambda: broker.messages_routed) - before
        assert routed < COUNT or committing.client.outcome is None, (
            "the commit was routed in one go: the loop never answered in between"
        )
        return 0 < routed < COUNT

    # the loop answers between slices, so this sees the commit part way through
    wait_for(routing_part_of_it, 30, 0.001, "the commit to be part way routed")
    sender.send(Message(body="ping"))  # waits for its outcome
    assert committing.client.outcome is None, "the ping was only served after the commit"
    ping.close()
    assert committing.join() == "committed"
    assert [m.body for m in consume_all(thread.url, "big")] == [f"tx{i}" for i in range(COUNT)]
    assert [m.body for m in consume_all(thread.url, "ping")] == ["warm", "ping"]


def test_a_duplicate_found_in_a_later_slice_rolls_back_the_whole_commit(scow_broker, small_slices):
    thread = scow_broker()
    committing = Committing(TxDuplicates(thread.url, "dups", 100, commit=True))
    assert committing.join() == "commit-failed"
    assert consume_all(thread.url, "dups", quiet=0.5) == []
    # the ids of the rolled-back commit were not admitted: a send of one goes through
    conn = BlockingConnection(thread.url, timeout=10)
    conn.create_sender("dups").send(
        Message(body="again", durable=True, properties={DUPLICATE_ID_PROPERTY: "twice"})
    )
    conn.close()
    assert [m.body for m in consume_all(thread.url, "dups")] == ["again"]
    # what the slices before the failure had stored is accounted for no more
    wait_for(lambda: thread.call(lambda: thread.broker.limits.messages) == 0, 10, 0.05, "none held")


def test_a_large_transactional_acknowledgement_commits_in_slices(scow_broker, small_slices):
    thread = scow_broker()
    conn = BlockingConnection(thread.url, timeout=30)
    sender = conn.create_sender("acked")
    for i in range(300):
        sender.send(Message(body=f"m{i}", durable=True))
    conn.close()
    receiver = TxReceiver(thread.url, "acked", 300, commit=True)
    assert Committing(receiver).join() == "committed"
    assert len(receiver.received) == 300
    assert consume_all(thread.url, "acked", quiet=0.5) == []
