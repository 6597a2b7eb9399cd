"""Large messages over the wire: bodies over min-large-message-size go to a file of their
own as they arrive and are streamed back from it (crashes: tests/durability/
test_large_message_crash.py). Every test runs on the file journal and again on the
database store (SQLite), where the bodies are rows of LARGE_MESSAGES instead."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from proton import Delivery, Message
from proton.reactor import Copy
from proton.utils import LinkDetached

from scow.core.large_message_files import FileLargeMessageStore
from scow.core.management import Management
from scow.core.testing import DEFAULT_PLUGINS, wait_for
from scow.protocols.amqp import engine
from tests.database.backends import on_database

from .helpers import RawClient, connected, receive, send, settle_modified

SMALL_LARGE = 16 << 10  # a threshold low enough that tests stay quick


def large_broker(scow_broker: Any, **sections: dict[str, Any]) -> Any:
    amqp = {"min-large-message-size": SMALL_LARGE, **sections.pop("amqp", {})}
    return scow_broker(sections={"amqp": amqp, **sections})


def on_file_journal(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with the file journal in place of the memory journal: records are
    written and synced, and so are durable large messages' files (large-message-sync)."""
    plugins = kwargs.get("plugins", DEFAULT_PLUGINS)
    swapped = ["file-journal" if p == "memory-journal" else p for p in plugins]
    return {**kwargs, "plugins": swapped}


@pytest.fixture(params=["file", "database"])
def scow_broker(request: pytest.FixtureRequest, scow_broker: Any) -> Any:
    """The brokers of these tests: on the file journal, then on the database store."""
    if request.param == "file":
        return lambda **kwargs: scow_broker(**on_file_journal(kwargs))
    return lambda **kwargs: scow_broker(**on_database(kwargs, ""))


def files(broker: Any) -> list[Any]:
    """The stored bodies: files, or the ids of the bodies in the database's table."""
    store = broker.broker.large_messages
    if isinstance(store, FileLargeMessageStore):
        directory = store.directory
        return sorted(directory.iterdir()) if directory.is_dir() else []
    t = store.db.schema.large_messages.c
    with store.db.engine.connect() as conn:
        return sorted(conn.execute(sa.select(t.id).distinct()).scalars())


def body_of(size: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(256)) * (size // 256) + b"x" * (size % 256)


def test_a_large_message_goes_to_its_file_and_comes_back_whole(scow_broker):
    broker = large_broker(scow_broker)
    body = body_of(3 << 20)
    with connected(broker.url) as conn:
        send(conn, "big", Message(body=body, durable=True, subject="s", properties={"k": 1}))
        assert len(files(broker)) == 1
        figures = broker.call(broker.broker.stats)["large-messages"]
        assert figures == {"files": 1, "bytes": figures["bytes"], "arriving": 0}
        assert figures["bytes"] > len(body)  # the whole message as sent, sections and all
        if isinstance(files(broker)[0], Path):
            assert files(broker)[0].stat().st_size == figures["bytes"]
        stats = broker.queue_stats("big")
        assert stats["message-count"] == 1
        # memory accounting counts the head, not the 3 MiB body
        assert broker.call(lambda: broker.broker.addresses["big"].size) < 4096
        receiver = conn.create_receiver("big", credit=1)
        (got,) = receive(receiver, 1)
    assert got.body == body and got.subject == "s" and got.properties == {"k": 1}
    wait_for(lambda: not files(broker), 5, what="the file to go with the acknowledgement")


def test_an_amqp_sequence_body_streams_to_its_file_and_back_as_data_sections_do(scow_broker):
    """Any body section is opaque bytes after the sections the broker parses: a list in
    amqp-sequence sections (proton's `inferred`) is stored as it arrives, as data is."""
    broker = large_broker(scow_broker)
    items = [body_of(1000, seed=i) for i in range(3000)]  # 3 MB
    message = Message(body=items, durable=True, properties={"k": 1})
    message.inferred = True
    encoded = message.encode()
    assert b"\x00\x53\x76" in encoded[:40]  # an amqp-sequence section
    client = RawClient(broker.port)
    link = engine.new_sender(client.session, "seq", "seq")
    client.until(lambda: engine.link_credit(link) > 0, "credit")
    engine.begin_send(link, b"1", encoded[: 2 << 20])
    client.flush()
    client.until(
        lambda: broker.call(broker.broker.stats)["large-messages"]["arriving"] == 1,
        "the body to arrive into its store",
    )
    engine.send_more(link, encoded[2 << 20 :])
    engine.link_advance(link)
    client.until(lambda: (broker.queue_stats("seq") or {}).get("message-count"), "the message")
    client.close()
    assert len(files(broker)) == 1
    assert broker.call(lambda: broker.broker.addresses["seq"].size) < 4096
    with connected(broker.url) as conn:
        (got,) = receive(conn.create_receiver("seq", credit=1), 1)
    assert got.inferred and got.body == items and got.properties == {"k": 1}
    wait_for(lambda: not files(broker), 5, what="the file to go with the acknowledgement")


def test_a_message_below_the_threshold_stays_in_memory(scow_broker):
    broker = large_broker(scow_broker)
    with connected(broker.url) as conn:
        send(conn, "small", Message(body=b"x" * (SMALL_LARGE // 2), durable=True))
        assert files(broker) == []
        (got,) = receive(conn.create_receiver("small", credit=1), 1)
    assert got.body == b"x" * (SMALL_LARGE // 2)


def test_a_durable_message_larger_than_a_journal_file_is_accepted(scow_broker):
    # the journal holds only its head: a 12 MiB message in 10 MiB journal files
    broker = scow_broker()
    body = os.urandom(12 << 20)
    with connected(broker.url) as conn:
        send(conn, "huge", Message(body=body, durable=True))
        (got,) = receive(conn.create_receiver("huge", credit=1), 1)
    assert got.body == body


def test_a_message_over_max_message_size_is_refused_naming_the_limit(scow_broker):
    broker = large_broker(scow_broker, amqp={"max-message-size": 1 << 20})
    with connected(broker.url) as conn:
        sender = conn.create_sender("limited")
        with pytest.raises(LinkDetached) as refused:
            sender.send(Message(body=b"x" * (2 << 20), durable=True))
    assert "message-size-exceeded" in str(refused.value)
    assert "max-message-size 1048576" in str(refused.value)
    wait_for(lambda: not files(broker), 5, what="the partial file to go")


def test_one_file_for_every_queue_a_multicast_message_reaches(scow_broker):
    broker = large_broker(scow_broker)
    body = body_of(1 << 20)
    with connected(broker.url) as conn:
        first = conn.create_receiver("news", name="a", options=_topic(), credit=0)
        second = conn.create_receiver("news", name="b", options=_topic(), credit=0)
        sender = conn.create_sender("news", options=_topic())
        sender.send(Message(body=body, durable=True))
        assert len(files(broker)) == 1
        first.flow(1)
        (got,) = receive(first, 1)
        assert got.body == body
        assert len(files(broker)) == 1  # the other subscription still holds it
        second.flow(1)
        (got,) = receive(second, 1)
        assert got.body == body
    wait_for(lambda: not files(broker), 5, what="the file to go with the last ack")


def _topic() -> Any:
    from .helpers import Capabilities

    return Capabilities("topic")


def test_a_released_large_message_is_redelivered_with_its_count(scow_broker):
    broker = large_broker(scow_broker)
    body = body_of(1 << 20, seed=3)
    with connected(broker.url) as conn:
        send(conn, "again", Message(body=body, durable=True))
        receiver = conn.create_receiver("again", credit=1)
        first = receiver.receive(timeout=10)
        assert first.delivery_count == 0
        settle_modified(receiver, failed=True)
        second = receiver.receive(timeout=10)
        receiver.accept()
    assert second.body == body and second.delivery_count == 1


def test_a_large_message_sent_while_others_stream_keeps_the_order(scow_broker):
    broker = large_broker(scow_broker)
    sizes = [100, 2 << 20, 200, 1 << 20, 300]
    messages = [Message(body=body_of(n, seed=i), durable=True) for i, n in enumerate(sizes)]
    with connected(broker.url) as conn:
        send(conn, "mixed", *messages)
        got = receive(conn.create_receiver("mixed", credit=10), len(sizes))
    assert [m.body for m in got] == [m.body for m in messages]


def test_rejected_large_message_moves_to_the_dead_letter_address_with_its_file(scow_broker):
    broker = large_broker(scow_broker)
    body = body_of(1 << 20, seed=5)
    with connected(broker.url) as conn:
        send(conn, "doomed", Message(body=body, durable=True))
        receiver = conn.create_receiver("doomed", credit=1)
        receiver.receive(timeout=10)
        receiver.reject()
        (dead,) = receive(conn.create_receiver("DLA", credit=1), 1)
        assert len(files(broker)) == 1  # moved, not copied
    assert dead.body == body
    assert {str(k): v for k, v in dead.annotations.items()}["x-opt-ORIG-ADDRESS"] == "doomed"
    wait_for(lambda: not files(broker), 5, what="the file to go")


def test_a_consumer_that_leaves_mid_stream_gives_the_message_back(scow_broker):
    broker = large_broker(scow_broker)
    body = body_of(8 << 20, seed=9)
    with connected(broker.url) as conn:
        send(conn, "left", Message(body=body, durable=True))
    with connected(broker.url) as conn:
        conn.create_receiver("left", credit=1)
        wait_for(lambda: broker.queue_stats("left")["delivering-count"] == 1, 5)
    # the first consumer closed before settling: the message waits again, whole
    with connected(broker.url) as conn:
        (got,) = receive(conn.create_receiver("left", credit=1), 1)
    assert got.body == body
    wait_for(lambda: not files(broker), 5, what="the file to go")


def test_presettled_large_messages_are_delivered_and_their_files_go(scow_broker):
    broker = large_broker(scow_broker)
    body = body_of(1 << 20, seed=11)
    with connected(broker.url) as conn:
        sender = conn.create_sender("fast")
        sender.send(Message(body=body, durable=False))
        sender.send(Message(body=body, durable=False))
        wait_for(lambda: (broker.queue_stats("fast") or {}).get("message-count") == 2, 5)
        got = receive(conn.create_receiver("fast", credit=2), 2)
    assert [m.body for m in got] == [body, body]
    wait_for(lambda: not files(broker), 5, what="the files to go")


def test_a_large_message_that_is_not_durable_is_accepted_without_sync(scow_broker):
    broker = large_broker(scow_broker)
    with connected(broker.url) as conn:
        sender = conn.create_sender("plain")
        delivery = sender.send(Message(body=body_of(1 << 20)))
        assert delivery.remote_state == Delivery.ACCEPTED
        assert len(files(broker)) == 1


PAGING = {
    "max-size-bytes": 10_000,
    "page-size-bytes": 8_000,
    "auto-delete-queues": False,
    "auto-delete-addresses": False,
}


def test_large_messages_in_pages_are_delivered_whole_and_their_files_go(scow_broker):
    broker = scow_broker(
        sections={"amqp": {"min-large-message-size": SMALL_LARGE}},
        address_settings={"#": PAGING},
    )
    bodies = [body_of(256 << 10, seed=i) for i in range(6)]
    with connected(broker.url) as conn:
        send(conn, "paged", *(Message(body="s" * 500, durable=True) for _ in range(40)))
        assert broker.call(lambda: broker.broker.addresses["paged"].pager.paging)
        send(conn, "paged", *(Message(body=b, durable=True) for b in bodies))
        assert len(files(broker)) == 6
        # the pages hold the heads, the files the bodies
        assert broker.call(lambda: broker.broker.addresses["paged"].pager.paged_bytes) < 100_000
        got = receive(conn.create_receiver("paged", credit=5), 46)
    assert [bytes(m.body) for m in got[40:]] == bodies
    wait_for(lambda: not files(broker), 10, what="the files to go with their pages")


def _queues(**tables: Any) -> dict[str, Any]:
    return {name: {"routing-type": "ANYCAST", **t} for name, t in tables.items()}


def test_selectors_priority_and_last_value_read_a_large_messages_head(scow_broker):
    broker = large_broker(
        scow_broker,
        queues=_queues(
            prio={"arguments": {"qpid.priorities": 10}},
            prices={"arguments": {"last-value-key": "stock"}},
        ),
    )
    big = body_of(256 << 10)
    with connected(broker.url) as conn:
        send(
            conn, "prio",
            Message(body=big, priority=1, properties={"n": 1}, durable=True),
            Message(body=big, priority=9, properties={"n": 9}, durable=True),
        )  # fmt: skip
        got = receive(conn.create_receiver("prio", credit=2), 2)
        assert [m.properties["n"] for m in got] == [9, 1]
        send(
            conn, "prices",
            Message(body=big, properties={"stock": "A", "v": 1}, durable=True),
            Message(body=big, properties={"stock": "A", "v": 2}, durable=True),
        )  # fmt: skip
        (last,) = receive(conn.create_receiver("prices", credit=5), 1)
        assert last.properties["v"] == 2 and bytes(last.body) == big
        send(conn, "sel", *(Message(body=big, properties={"k": k}) for k in ("a", "b")))
        from proton.reactor import Selector

        (chosen,) = receive(conn.create_receiver("sel", credit=5, options=Selector("k = 'b'")), 1)
        assert chosen.properties["k"] == "b"
    # the superseded last value's file went with it; the one not selected still waits
    wait_for(lambda: len(files(broker)) == 1, 5, what="one file left")


def test_an_expired_large_message_moves_to_the_expiry_address_with_its_file(scow_broker):
    broker = large_broker(scow_broker)
    body = body_of(256 << 10, seed=7)
    with connected(broker.url) as conn:
        send(conn, "brief", Message(body=body, ttl=0.2, durable=True))
        (expired,) = receive(conn.create_receiver("ExpiryQueue", credit=1), 1)
    assert bytes(expired.body) == body
    assert "x-opt-ACTUAL-EXPIRY" in {str(k) for k in expired.annotations}
    wait_for(lambda: not files(broker), 5, what="the file to go")


def send_in_transaction(
    url: str, address: str, bodies: list[bytes], *, commit: bool, before: tuple[bytes, ...] = ()
) -> str:
    """Send durable messages of `bodies` in one transaction, discharged right after the
    sends (on the same link, `before` are sent first outside it); returns the outcome
    ("committed" or "aborted")."""
    from proton.reactor import Container

    from .test_transactions import TxClient

    class LargeTx(TxClient):
        def on_transaction_declared(self, event: Any) -> None:
            for body in before:
                self.sender.send(Message(body=body, durable=True))
            for body in bodies:
                event.transaction.send(self.sender, Message(body=body, durable=True))
            self.discharge(event.transaction)

    client = LargeTx(url, address, len(bodies), commit=commit)
    Container(client).run()
    return str(client.outcome)


def test_transactions_commit_large_messages_and_roll_them_back_with_their_files(scow_broker):
    broker = large_broker(scow_broker)
    bodies = [body_of(256 << 10, seed=i) for i in range(2)]
    assert send_in_transaction(broker.url, "txl", bodies, commit=False) == "aborted"
    wait_for(lambda: not files(broker), 5, what="the rolled back files to go")
    assert send_in_transaction(broker.url, "txl", bodies, commit=True) == "committed"
    assert len(files(broker)) == 2
    with connected(broker.url) as conn:
        got = receive(conn.create_receiver("txl", credit=2), 2)
    assert [bytes(m.body) for m in got] == bodies


def test_a_qpid_paged_queue_pages_large_messages_heads_with_a_reference_to_their_files(
    scow_broker,
):
    """A page record holds a large message's head and refers to its body: the messages
    leave memory with their pages (they are not pinned there), come back whole and in
    order, and their files go as they are acknowledged. The page size bounds the head,
    not the body."""
    broker = scow_broker(
        plugins=[*DEFAULT_PLUGINS, "qpid-paged-queues"],
        sections={
            "amqp": {"min-large-message-size": SMALL_LARGE},
            "queues": _queues(pq={"arguments": {"qpid.paging": True, "qpid.max_pages_loaded": 1}}),
        },
    )
    bodies = [body_of(64 << 10, seed=i) for i in range(60)]  # each 16 x a page
    with connected(broker.url) as conn:
        send(conn, "pq", *(Message(body="k" * 1000) for _ in range(20)))
        send(
            conn,
            "pq",
            *(
                Message(body=b, durable=True, properties={"n": i, "pad": "p" * 300})
                for i, b in enumerate(bodies)
            ),
        )
        assert len(files(broker)) == len(bodies)
        stats = broker.queue_stats("pq")
        assert stats["pages"] > 4 and stats["pages-loaded"] == 1
        # about 11 heads fit in a page: one page's worth in memory, not all 60
        assert stats["messages-in-memory"] <= 20, stats["messages-in-memory"]
        assert broker.call(lambda: broker.broker.addresses["pq"].size) < 20 * 1024
        # a browser reads the pages it passes without loading them, bodies whole
        browser = conn.create_receiver("pq", credit=10, name="browser", options=Copy())
        browsed = receive(browser, 80, accept=False)
        assert [bytes(m.body) for m in browsed[20:]] == bodies
        browser.close()
        assert broker.queue_stats("pq")["pages-loaded"] == 1
        got = receive(conn.create_receiver("pq", credit=10), 80)
    assert [bytes(m.body) for m in got[20:]] == bodies
    assert [m.properties["n"] for m in got[20:]] == list(range(60))
    wait_for(lambda: not files(broker), 5, what="the files to go with the acknowledgements")


def test_a_purged_queue_deletes_its_large_messages_files(scow_broker):
    broker = large_broker(scow_broker)
    with connected(broker.url) as conn:
        send(conn, "purged", *(Message(body=body_of(64 << 10, seed=i)) for i in range(3)))
    assert len(files(broker)) == 3
    assert broker.call(lambda: Management(broker.broker).purge_queue("purged")) == 3
    wait_for(lambda: not files(broker), 5, what="the bodies to go with the purge")
    assert broker.call(broker.broker.stats)["large-messages"]["files"] == 0


def test_duplicate_detection_drops_a_resent_large_message_and_its_file(scow_broker):
    broker = large_broker(scow_broker)
    body = body_of(256 << 10, seed=4)
    with connected(broker.url) as conn:
        sender = conn.create_sender("once")
        for _ in range(2):
            message = Message(body=body, durable=True, properties={"_AMQ_DUPL_ID": "big-1"})
            assert sender.send(message).remote_state == Delivery.ACCEPTED
        # the resend's file (its rows) went with it: deleted off the loop, so soon after
        wait_for(lambda: len(files(broker)) == 1, 5, what="the resend's body to go")
        got = receive(conn.create_receiver("once", credit=5), 1)
    assert bytes(got[0].body) == body
    wait_for(lambda: not files(broker), 5, what="the file to go")
