"""Streams on addresses that page: a stream keeps every message it accepts in its own
segments, whatever the broker's memory or its address's limits do, and paging ends once
the pages are consumed and the address has room (issue 17, hole 2)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from proton import Message, Timeout, symbol
from proton.reactor import Container, Filter
from proton.utils import SendException

from scow.core.model import StorageFull
from scow.core.testing import BrokerThread, broker_processes, wait_for
from scow.protocols.amqp.codec import MessageInfo
from tests.spark.conftest import PLUGINS, client, stream
from tests.wire.helpers import Capabilities, Durable, bulk_send, connected, detach, receive
from tests.wire.test_transactions import TxClient

OFFSET = symbol("scow:stream-offset")
BODY = "x" * 500


def numbered(prefix: str) -> Callable[[int], Message]:
    """Durable messages whose id is `prefix` and their number."""
    return lambda i: Message(id=f"{prefix}{i}", body=f"{i}:{BODY}", durable=True)


def address_stats(broker: BrokerThread, name: str) -> dict[str, Any]:
    return broker.call(lambda: broker.broker.address_stats(broker.broker.addresses[name]))


def read_stream(url: str, queue: str, count: int) -> list[Message]:
    """Every message of stream `queue` from the first; exactly `count` of them."""
    with connected(url) as conn:
        receiver = conn.create_receiver(
            queue, name=f"r{time.monotonic_ns()}", options=Filter({OFFSET: "first"}), credit=500
        )
        got = receive(receiver, count)
        with pytest.raises(Timeout):  # and nothing more
            receiver.receive(timeout=0.3)
    return got


def sequence_numbers(messages: list[Message]) -> list[int]:
    return [m.annotations["x-opt-sequence-number"] for m in messages]


def stream_broker(scow_broker: Any, queues: dict[str, Any], **kwargs: Any) -> BrokerThread:
    sections = {"queues": queues, **kwargs.pop("sections", {})}
    return scow_broker(plugins=PLUGINS, sections=sections, **kwargs)


#: The broker as a whole holds ~100 KB of messages in memory; addresses keep their queues.
SMALL_BROKER = {
    "sections": {"broker": {"global-max-size": 100_000}},
    "address_settings": {
        "#": {
            "page-size-bytes": 16_000,
            "auto-delete-queues": False,
            "auto-delete-addresses": False,
        }
    },
}


def test_a_stream_keeps_every_message_while_another_address_fills_the_broker(scow_broker):
    # the scenario, scaled down: a backlog elsewhere fills the broker's memory
    broker = stream_broker(scow_broker, {"events": stream()}, **SMALL_BROKER)
    bulk_send(broker.url, "events", 100, numbered("e"))
    bulk_send(broker.url, "backlog", 400, numbered("b"))  # 4x the broker's memory
    assert address_stats(broker, "backlog")["paging"]
    bulk_send(broker.url, "events", 100, lambda i: numbered("e")(100 + i))
    with connected(broker.url) as conn:  # the backlog drained
        got = receive(conn.create_receiver("backlog", credit=50), 400)
        assert [m.id for m in got] == [f"b{i}" for i in range(400)]
    wait_for(lambda: not address_stats(broker, "backlog")["paging"], what="backlog paging to end")
    bulk_send(broker.url, "events", 100, lambda i: numbered("e")(200 + i))
    wait_for(lambda: broker.queue_stats("events")["next-sequence"] >= 300, what="300 stored")

    got = read_stream(broker.url, "events", 300)
    assert [m.id for m in got] == [f"e{i}" for i in range(300)]
    assert sequence_numbers(got) == list(range(300))
    wait_for(lambda: not address_stats(broker, "events")["paging"], what="events paging to end")
    assert address_stats(broker, "events")["page-count"] == 0
    assert address_stats(broker, "backlog")["page-count"] == 0


def test_a_stream_with_only_its_own_messages_leaves_page_mode_under_its_limits(scow_broker):
    broker = stream_broker(
        scow_broker,
        {"events": stream()},
        address_settings={"events": {"max-size-bytes": 5_000, "page-size-bytes": 8_000}},
    )
    bulk_send(broker.url, "events", 200, numbered("e"))  # past max-size-bytes while writing
    wait_for(lambda: broker.queue_stats("events")["next-sequence"] >= 200, what="200 stored")
    wait_for(lambda: not address_stats(broker, "events")["paging"], what="paging to end")
    assert address_stats(broker, "events")["messages-written-to-pages"] == 0
    assert [m.id for m in read_stream(broker.url, "events", 200)] == [f"e{i}" for i in range(200)]


def test_stream_messages_an_older_broker_left_in_pages_go_to_the_stream_at_start(
    streams, monkeypatch
):
    from scow.plugins.paging import cursor as cursor_module
    from scow.plugins.spark.stream import StreamQueue

    limits = {"events": {"max-size-bytes": 5_000, "page-size-bytes": 8_000}}
    monkeypatch.setattr(StreamQueue, "stores_own_messages", False)  # as before the fix
    broker = streams.start({"events": stream()}, address_settings=limits)
    bulk_send(broker.url, "events", 200, numbered("e"))
    stored = broker.queue_stats("events")["next-sequence"]
    paged = address_stats(broker, "events")["cursors"]["events"]["messages-paged"]
    assert paged > 100 and stored + paged == 200  # what the issue found: lost in pages
    broker.stop()
    monkeypatch.undo()

    monkeypatch.setattr(cursor_module, "DRAIN_BATCH", 16)  # several batches
    broker = streams.start({"events": stream()}, address_settings=limits)
    wait_for(lambda: broker.queue_stats("events")["next-sequence"] >= 200, what="200 stored")
    got = read_stream(broker.url, "events", 200)
    assert [m.id for m in got] == [f"e{i}" for i in range(200)]
    wait_for(lambda: not address_stats(broker, "events")["paging"], what="paging to end")
    wait_for(lambda: address_stats(broker, "events")["page-count"] == 0, what="pages deleted")
    broker.stop()
    broker = streams.start({"events": stream()}, address_settings=limits)  # and only once
    assert broker.queue_stats("events")["next-sequence"] == 200
    assert not address_stats(broker, "events")["paging"]


def test_a_stream_and_a_durable_subscription_on_a_paging_address_both_get_everything(
    scow_broker,
):
    queues = {
        "news-stream": {**stream(), "address": "news", "routing-type": "MULTICAST"},
        "news": {"routing-type": "ANYCAST"},
    }
    paging = {"news": {"max-size-bytes": 10_000, "page-size-bytes": 8_000}}
    broker = stream_broker(scow_broker, queues, address_settings=paging)
    topic = [Capabilities("topic"), Durable()]
    with connected(broker.url, container_id="c") as conn:
        sub = conn.create_receiver("news", name="sub", options=topic)
        detach(conn, sub, until=lambda: broker.queue_stats("c.sub")["consumer-count"] == 0)
    count = 300
    bulk_send(broker.url, "news", count, numbered("n"))
    assert address_stats(broker, "news")["paging"]
    assert broker.queue_stats("c.sub")["messages-paged"] > count // 2
    wait_for(lambda: broker.queue_stats("news-stream")["next-sequence"] >= count, what="stored")

    expected = [f"n{i}" for i in range(count)]
    assert [m.id for m in read_stream(broker.url, "news-stream", count)] == expected
    with connected(broker.url, container_id="c") as conn:  # pages, read by the subscription
        sub = conn.create_receiver("news", name="sub", options=topic, credit=50)
        assert [m.id for m in receive(sub, count)] == expected
        anycast = conn.create_receiver("news", credit=50)
        assert [m.id for m in receive(anycast, count)] == expected
    wait_for(lambda: not address_stats(broker, "news")["paging"], what="paging to end")
    wait_for(lambda: address_stats(broker, "news")["page-count"] == 0, what="pages deleted")
    assert [m.id for m in read_stream(broker.url, "news-stream", count)] == expected


def test_transactional_sends_reach_a_paging_stream_at_commit(scow_broker):
    queues = {
        "events": stream(),
        "audit": {**stream(), "address": "mixed", "routing-type": "MULTICAST"},
        "mixed-sub": {"address": "mixed", "routing-type": "MULTICAST"},
    }
    broker = stream_broker(scow_broker, queues, **SMALL_BROKER)
    bulk_send(broker.url, "backlog", 400, numbered("b"))  # the broker is full: all page
    for address in ("events", "mixed"):
        tx = TxClient(broker.url, address, 30, commit=True)
        Container(tx).run()
        assert tx.outcome == "committed"
        assert address_stats(broker, address)["paging"] or address == "events"
    rolled_back = TxClient(broker.url, "events", 5, commit=False)
    Container(rolled_back).run()
    assert rolled_back.outcome == "aborted"

    wait_for(lambda: broker.queue_stats("events")["next-sequence"] >= 30, what="events stored")
    wait_for(lambda: broker.queue_stats("audit")["next-sequence"] >= 30, what="audit stored")
    expected = [f"tx{i}" for i in range(30)]
    assert [m.body for m in read_stream(broker.url, "events", 30)] == expected
    assert [m.body for m in read_stream(broker.url, "audit", 30)] == expected
    assert broker.queue_stats("mixed-sub")["messages-paged"] == 30
    with connected(broker.url) as conn:
        sub = conn.create_receiver("mixed::mixed-sub", credit=50)
        assert [m.body for m in receive(sub, 30)] == expected
        receive(conn.create_receiver("backlog", credit=50), 400)
    for address in ("backlog", "events", "mixed"):
        wait_for(lambda a=address: not address_stats(broker, a)["paging"], what=f"{address}")


def test_sigkill_mid_traffic_on_a_paging_address_keeps_every_accepted_message_once(
    tmp_path: Path,
):
    sections = {
        "queues": {
            "feed-stream": {**stream(), "address": "feed", "routing-type": "MULTICAST"},
            "feed-sub": {"address": "feed", "routing-type": "MULTICAST"},  # never consumed
        }
    }
    paging = {"feed": {"max-size-bytes": 20_000, "page-size-bytes": 16_000}}
    with broker_processes(tmp_path) as start:
        broker = start(plugins=PLUGINS, sections=sections, address_settings=paging)
        accepted: list[str] = []

        def produce() -> None:
            try:
                with connected(broker.url) as conn:
                    sender = conn.create_sender("feed")
                    for i in range(100_000):
                        sender.send(Message(id=f"f{i}", body=f"{i}:{BODY}", durable=True))
                        accepted.append(f"f{i}")
            except (SendException, Exception):  # the broker was killed under it
                return

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        wait_for(lambda: len(accepted) >= 1500, timeout=60, what="1500 accepted")
        broker.kill()  # mid-traffic: page, journal and segment writes in flight
        producer.join(20)
        assert not producer.is_alive()
        sent = list(accepted)

        broker = start(plugins=PLUGINS, sections=sections, address_settings=paging)
        c = client(broker.url)
        try:
            wait_for(
                lambda: c.call("stream", "feed-stream", "READ")["next-sequence"] >= len(sent),
                what="the stream recovered",
            )
            got = [
                MessageInfo(m).message_id
                for batch in c.read("feed-stream", 0, 10**9, address="feed")
                for m in batch
            ]
            subscription = c.call("queue", "feed-sub", "READ")
            feed = c.call("address", "feed", "READ")
        finally:
            c.close()
    assert len(got) == len(set(got)), "a message is in the stream twice"
    assert set(sent) <= set(got), f"{len(set(sent) - set(got))} accepted messages lost"
    assert len(got) <= len(sent) + 1  # at most the one in flight when the broker died
    assert subscription["message-count"] >= len(sent)
    assert feed["paging"] and list(feed["cursors"]) == ["feed-sub"]  # the stream has none


# --------------------------------------------------------------------------- storage full

MIXED = {
    "audit": {**stream(), "address": "mixed", "routing-type": "MULTICAST"},
    "mixed-sub": {"address": "mixed", "routing-type": "MULTICAST"},
}
MIXED_PAGING = {"mixed": {"max-size-bytes": 2_000, "page-size-bytes": 8_000}}


def journal_refuses(broker: BrokerThread, monkeypatch: Any, *, in_tx: bool) -> None:
    """From now on the message journal has no room for new messages (in or out of
    transactions, as asked), as on a full file system."""
    storage = broker.broker.storage
    store = storage.store_message

    def refuse(*args: Any, tx_id: int | None = None, **kwargs: Any) -> None:
        if (tx_id is not None) == in_tx:
            raise StorageFull("journal: no room (test)")
        store(*args, tx_id=tx_id, **kwargs)

    monkeypatch.setattr(storage, "store_message", refuse)


def test_a_send_to_a_paging_stream_address_is_not_journaled_so_a_full_journal_takes_it(
    streams, monkeypatch
):
    # the stream's store and the pages are the only records of it: written once each
    broker = streams.start(MIXED, address_settings=MIXED_PAGING)
    bulk_send(broker.url, "mixed", 20, numbered("m"))  # past max-size-bytes: it pages
    assert address_stats(broker, "mixed")["paging"]
    wait_for(lambda: broker.queue_stats("audit")["next-sequence"] >= 20, what="20 stored")
    journal_refuses(broker, monkeypatch, in_tx=False)
    bulk_send(broker.url, "mixed", 1, lambda i: numbered("m")(20))  # accepted all the same
    monkeypatch.undo()
    wait_for(lambda: broker.queue_stats("audit")["next-sequence"] >= 21, what="21 stored")
    expected = [f"m{i}" for i in range(21)]
    assert [m.id for m in read_stream(broker.url, "audit", 21)] == expected
    with connected(broker.url) as conn:
        sub = conn.create_receiver("mixed::mixed-sub", credit=50)
        assert [m.id for m in receive(sub, 21)] == expected


def test_a_commit_the_journal_has_no_room_for_still_reaches_the_stream_once(streams, monkeypatch):
    broker = streams.start(MIXED, address_settings=MIXED_PAGING)
    bulk_send(broker.url, "mixed", 20, numbered("m"))
    assert address_stats(broker, "mixed")["paging"]
    journal_refuses(broker, monkeypatch, in_tx=True)  # after the broker's own journal part
    tx = TxClient(broker.url, "mixed", 10, commit=True)
    Container(tx).run()
    assert tx.outcome == "committed"
    monkeypatch.undo()
    assert "audit" in address_stats(broker, "mixed")["cursors"]  # it went through the pages
    expected = [f"m{i}" for i in range(20)] + [f"tx{i}" for i in range(10)]
    ids = lambda got: [m.id or m.body for m in got]  # noqa: E731
    wait_for(lambda: broker.queue_stats("audit")["next-sequence"] >= 30, what="30 stored")
    assert ids(read_stream(broker.url, "audit", 30)) == expected
    broker.stop()

    broker = streams.start(MIXED, address_settings=MIXED_PAGING)  # once, after a restart
    assert ids(read_stream(broker.url, "audit", 30)) == expected
    with connected(broker.url) as conn:
        sub = conn.create_receiver("mixed::mixed-sub", credit=50)
        assert ids(receive(sub, 30)) == expected
    wait_for(lambda: not address_stats(broker, "mixed")["paging"], what="paging to end")
    wait_for(lambda: address_stats(broker, "mixed")["page-count"] == 0, what="pages deleted")
