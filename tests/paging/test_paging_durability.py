"""Paged durable messages across restarts and SIGKILL: nothing accepted lost, nothing acked back."""

from __future__ import annotations

import sqlite3
import threading
import time

from proton import Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

from scow.core.testing import wait_for
from tests.wire.helpers import bulk_send, connected, consume_all, receive, settle_modified
from tests.wire.test_transactions import TxClient

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies", "paging"]
FAST_JOURNAL = {"journal": {"journal-file-size": "1MiB", "journal-buffer-timeout": 500000}}
#: Everything pages; pages of ~10 messages of 500 bytes.
PAGE_ALWAYS = {"#": {"max-size-bytes": 0, "page-size-bytes": 5_000}}


def start(factory, **kw):
    return factory(plugins=PLUGINS, sections=FAST_JOURNAL, address_settings=PAGE_ALWAYS, **kw)


def durable(i: int) -> Message:
    return Message(body=f"{i}:" + "d" * 500, durable=True, properties={"n": i})


def _paged_rows(data_dir) -> int:
    with sqlite3.connect(data_dir / "scow.db") as db:
        return db.execute("SELECT count(*) FROM PAGE_STORE_DATA").fetchone()[0]


def test_paged_durable_messages_survive_sigkill_in_order_with_counts_and_acks(
    scow_broker_process, tmp_path, page_store
):
    broker = start(scow_broker_process)
    bulk_send(broker.url, "p", 300, durable)
    bulk_send(broker.url, "p", 10, lambda i: Message(body=f"t{i}", durable=False))
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("p", credit=1)
        got = receive(receiver, 100)
        assert [m.properties["n"] for m in got] == list(range(100))
        failed = receiver.receive(timeout=10)
        settle_modified(receiver, failed=True)  # message 100: delivery count 1, on disk
        receiver.close()
        # a durable send accepted after the acks: the journal wrote them before it
        bulk_send(broker.url, "other", 1, durable)
    assert failed.properties["n"] == 100
    if page_store == "file":
        assert list((tmp_path / "data" / "paging").glob("p-*/*.page"))  # they are in pages
    else:
        assert _paged_rows(tmp_path / "data")
    broker.kill()
    restarted = start(scow_broker_process, port=broker.port)
    recovered = consume_all(restarted.url, "p")
    assert [m.properties["n"] for m in recovered] == list(range(100, 300))
    assert recovered[0].delivery_count == 1
    assert all(m.delivery_count == 0 for m in recovered[1:])


def test_sigkill_mid_traffic_while_paging_loses_no_accepted_message(scow_broker_process):
    broker = start(scow_broker_process)
    stop = threading.Event()
    accepted: list[int] = []
    acked: list[int] = []

    def produce() -> None:
        try:
            sender = BlockingConnection(broker.url, timeout=10).create_sender("crash")
            n = 0
            while not stop.is_set():
                sender.send(durable(n))
                accepted.append(n)
                n += 1
        except Exception:
            return  # the broker was killed under us

    def consume() -> None:
        try:
            receiver = BlockingConnection(broker.url, timeout=10).create_receiver("crash")
            while not stop.is_set():
                message = receiver.receive(timeout=5)
                receiver.accept()
                acked.append(message.properties["n"])
        except Exception:
            return

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(accepted) > 200 and len(acked) > 20, timeout=30, what="traffic")
    time.sleep(0.5)  # the crash point, mid-traffic
    broker.kill()
    stop.set()
    for thread in threads:
        thread.join(20)
    restarted = start(scow_broker_process, port=broker.port)
    recovered = [m.properties["n"] for m in consume_all(restarted.url, "crash")]
    assert len(recovered) == len(set(recovered)), "a message was restored twice"
    assert recovered == sorted(recovered), "paged messages came back out of order"
    missing = set(accepted) - set(acked) - set(recovered)
    assert not missing, f"{len(missing)} accepted messages lost, e.g. {sorted(missing)[:5]}"


def test_torn_page_tail_is_cut_and_every_whole_message_delivered(scow_broker_process, tmp_path):
    broker = start(scow_broker_process)
    bulk_send(broker.url, "torn", 50, durable)
    assert broker.stop() == 0
    pages = sorted((tmp_path / "data" / "paging").glob("torn-*/*.page"))
    assert pages
    with open(pages[-1], "ab") as f:
        f.write(b"\x00\x00\x02\x00garbage: half a record")  # a torn append
    restarted = start(scow_broker_process, port=broker.port)
    assert [m.properties["n"] for m in consume_all(restarted.url, "torn")] == list(range(50))
    log = (tmp_path / "broker.log").read_text()
    assert "torn page tail cut" in log


def test_transactional_sends_to_a_paging_address(scow_broker_process):
    broker = start(scow_broker_process)
    committed = TxClient(broker.url, "tx", 5, commit=True)
    Container(committed).run()
    aborted = TxClient(broker.url, "tx", 5, commit=False)
    Container(aborted).run()
    assert (committed.outcome, aborted.outcome) == ("committed", "aborted")
    open_tx = _OpenTransaction(broker.url, "tx", 7)
    thread = threading.Thread(target=lambda: Container(open_tx).run(), daemon=True)
    thread.start()
    wait_for(lambda: open_tx.sent == 7, what="sends in the open transaction")
    time.sleep(0.2)  # let the broker take them in; the transaction stays open: the crash point
    broker.kill()
    thread.join(10)  # the client stops once its connection is gone
    assert not thread.is_alive()
    restarted = start(scow_broker_process, port=broker.port)
    assert [m.body for m in consume_all(restarted.url, "tx")] == [f"tx{i}" for i in range(5)]


class _OpenTransaction(MessagingHandler, TransactionHandler):
    """Sends `count` durable messages in a transaction it never discharges."""

    def __init__(self, url: str, address: str, count: int) -> None:
        super().__init__()
        self.url, self.address, self.count = url, address, count
        self.sent = 0

    def on_start(self, event):
        conn = event.container.connect(self.url, reconnect=False)
        self.sender = event.container.create_sender(conn, self.address)
        event.container.declare_transaction(conn, handler=self)

    def on_transport_closed(self, event):
        event.container.stop()

    def on_transaction_declared(self, event):
        for i in range(self.count):
            event.transaction.send(self.sender, Message(body=f"open{i}", durable=True))
            self.sent += 1
