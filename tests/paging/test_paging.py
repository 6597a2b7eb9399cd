"""Address paging over the wire: order, multicast cursors, limits, selectors, TTL, disk."""

from __future__ import annotations

import time

import pytest
from proton import Delivery, Message, Timeout
from proton.reactor import Copy, Selector
from proton.utils import SendException
from structlog.testing import capture_logs

from scow.core.testing import wait_for
from tests.wire.helpers import (
    Capabilities,
    Durable,
    bulk_send,
    connected,
    detach,
    drain,
    pump,
    receive,
    send,
)

BODY = "x" * 500
#: Page after ~10 messages, in pages of ~10 messages; keep queues to look at them after.
SMALL = {
    "max-size-bytes": 10_000,
    "page-size-bytes": 8_000,
    "auto-delete-queues": False,
    "auto-delete-addresses": False,
}


def paging_broker(scow_broker, **settings):
    return scow_broker(address_settings={"#": {**SMALL, **settings}})


def address_stats(broker, name: str) -> dict:
    return broker.call(lambda: broker.broker.address_stats(broker.broker.addresses[name]))


def page_files(broker, name: str) -> int:
    def count() -> int:
        pager = broker.broker.addresses[name].pager
        return len(pager.store.page_numbers()) if pager is not None else 0

    return broker.call(count)


def numbered(i: int, **kw) -> Message:
    return Message(body=f"{i}:{BODY}", properties={"n": i}, **kw)


def ns(messages) -> list[int]:
    return [m.properties["n"] for m in messages]


def test_order_is_kept_across_memory_and_pages_and_paging_ends(scow_broker):
    broker = paging_broker(scow_broker)
    bulk_send(broker.url, "orders", 300, numbered)
    stats = address_stats(broker, "orders")
    assert stats["paging"] and stats["page-count"] > 10
    assert broker.queue_stats("orders")["message-count"] == 300
    assert broker.queue_stats("orders")["messages-paged"] > 250
    with connected(broker.url) as conn:
        assert ns(receive(conn.create_receiver("orders", credit=20), 300)) == list(range(300))
    wait_for(lambda: not address_stats(broker, "orders")["paging"], what="paging to end")
    wait_for(lambda: page_files(broker, "orders") == 0, what="page files deleted")
    assert broker.queue_stats("orders")["message-count"] == 0


def test_two_consumers_share_a_paged_backlog_each_message_once_in_order(scow_broker):
    broker = paging_broker(scow_broker)
    bulk_send(broker.url, "shared", 300, numbered)
    assert broker.queue_stats("shared")["messages-paged"] > 250
    with connected(broker.url) as conn:
        receivers = [conn.create_receiver("shared", name=f"r{c}", credit=c) for c in (7, 13)]
        got: list[list[int]] = [[], []]

        def take() -> bool:
            for receiver, into in zip(receivers, got, strict=True):
                while receiver.fetcher.has_message:
                    into.append(receiver.fetcher.pop().properties["n"])
                    receiver.accept()
            return sum(map(len, got)) >= 300

        pump([conn], take, what="300 messages between the two consumers")
    assert all(got), "one consumer got nothing"
    assert sorted(got[0] + got[1]) == list(range(300))
    assert all(ns == sorted(ns) for ns in got), "a consumer got messages out of order"


def test_new_messages_after_paging_ends_go_to_memory_in_order(scow_broker):
    broker = paging_broker(scow_broker)
    bulk_send(broker.url, "q", 50, numbered)
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("q", credit=10)
        assert ns(receive(receiver, 50)) == list(range(50))
        wait_for(lambda: not address_stats(broker, "q")["paging"], what="paging to end")
        send(conn, "q", numbered(50), numbered(51))
        assert ns(receive(receiver, 2)) == [50, 51]
        assert address_stats(broker, "q")["page-count"] == 0


def test_a_drain_gets_the_paged_messages_its_credit_asks_for(scow_broker):
    """A paged queue with one consumer is handed what the consumer's credit takes as
    the credit comes (not read ahead into memory as objects): a drain, which the broker
    answers right after the credit, must find them handed over already."""
    broker = paging_broker(scow_broker)
    bulk_send(broker.url, "q", 30, numbered)
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("q", credit=0)

        def read() -> int:
            return address_stats(broker, "q")["cursors"]["q"]["page-reads"]

        wait_for(lambda: read() >= 1, what="the cursor's first page read")
        got = [ns(drain(conn, receiver, 1)) for _ in range(3)]
        assert got == [[0], [1], [2]]
        assert ns(drain(conn, receiver, 4)) == [3, 4, 5, 6]
        receiver.accept()


def test_every_drain_across_pages_gets_what_its_credit_asks_for(scow_broker):
    """A drain that meets a page not read yet waits for the read instead of being
    answered short (found by review: draining 100 paged messages 5 at a time gave 5 a
    drain for the first pages, then mostly 1: a JMS receiveNoWait, which drains, would
    find a queue with messages in pages empty)."""
    broker = paging_broker(scow_broker)
    bulk_send(broker.url, "q", 100, numbered)
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("q", credit=0)
        got = []
        for _ in range(20):
            batch = ns(drain(conn, receiver, 5))
            assert len(batch) == 5, f"drain {len(got) // 5 + 1} got {batch} after {len(got)}"
            got += batch
            for _ in batch:
                receiver.accept()  # one each: what a consumer holds counts in its reads
        assert got == list(range(100))
        assert drain(conn, receiver, 5) == []


def test_one_slow_subscription_does_not_make_the_others_read_pages(scow_broker):
    # room for the fast subscriptions to keep up in memory; the slow one has no consumer
    broker = paging_broker(scow_broker, **{"max-read-page-bytes": 1_000_000})
    topic = [Capabilities("topic"), Durable()]
    count = 400
    with connected(broker.url, container_id="c") as conn:
        slow = conn.create_receiver("news", name="slow", options=topic)
        detach(conn, slow, until=lambda: broker.queue_stats("c.slow")["consumer-count"] == 0)
        fast = [
            conn.create_receiver("news", name=f"fast{i}", options=topic, credit=1000)
            for i in range(2)
        ]
        bulk_send(broker.url, "news", count, numbered)
        for receiver in fast:
            assert ns(receive(receiver, count)) == list(range(count))
        cursors = address_stats(broker, "news")["cursors"]
        assert cursors["c.slow"]["messages-paged"] > count - 20
        assert [cursors[f"c.fast{i}"]["page-reads"] for i in range(2)] == [0, 0]
        assert address_stats(broker, "news")["paging"]
        slow = conn.create_receiver("news", name="slow", options=topic, credit=5)
        assert ns(receive(slow, count)) == list(range(count))
    wait_for(lambda: address_stats(broker, "news")["page-count"] <= 1, what="pages deleted")


@pytest.mark.parametrize("policy", ["DROP", "FAIL"])
def test_page_limit_applies_page_full_policy(scow_broker, policy):
    broker = paging_broker(scow_broker, **{"page-limit-messages": 20, "page-full-policy": policy})
    with connected(broker.url) as conn:
        sender = conn.create_sender("limited")
        refused = None
        for i in range(60):
            try:
                sender.send(numbered(i))
            except SendException as exc:
                refused = exc
                break
    count = broker.queue_stats("limited")["message-count"]
    assert (refused is not None) == (policy == "FAIL")
    assert 20 <= count < 45


def test_page_limit_fail_rejects_and_serves_other_addresses(scow_broker):
    broker = paging_broker(scow_broker, **{"page-limit-messages": 5, "page-full-policy": "FAIL"})
    with connected(broker.url) as conn:
        sender = conn.create_sender("lim")
        with pytest.raises(SendException) as refused:
            for i in range(40):
                sender.send(numbered(i))
        assert refused.value.state == Delivery.REJECTED
        send(conn, "elsewhere", numbered(0))
    assert address_stats(broker, "lim")["messages-refused-page-full"] == 1
    assert broker.queue_stats("elsewhere")["message-count"] == 1


def test_global_max_size_pages_every_address(scow_broker):
    broker = scow_broker(
        sections={"broker": {"global-max-size": 20_000}},
        address_settings={"#": {"page-size-bytes": 8_000}},
    )
    bulk_send(broker.url, "a", 40, numbered)
    assert address_stats(broker, "a")["paging"]
    bulk_send(broker.url, "b", 5, numbered)
    assert address_stats(broker, "b")["paging"]  # a filled the broker: b pages at once
    assert broker.queue_stats("b")["messages-paged"] == 5
    with connected(broker.url) as conn:
        assert ns(receive(conn.create_receiver("b"), 5)) == list(range(5))
        assert ns(receive(conn.create_receiver("a"), 40)) == list(range(40))


def test_max_read_page_bytes_bounds_memory_while_deliveries_stay_unsettled(scow_broker):
    """The reads wait, and say so (Artemis's ARTEMIS-4362 warning): a consumer that does
    not settle otherwise just sees the broker stop."""
    broker = paging_broker(scow_broker, **{"max-read-page-bytes": 20_000})
    bulk_send(broker.url, "held", 300, numbered)
    with connected(broker.url) as conn, capture_logs() as logs:
        receiver = conn.create_receiver("held", credit=300)
        got = []
        for _ in range(25):  # the read limit lets fewer than 40 out of pages
            got.append(receiver.receive(timeout=10))
        stats = broker.queue_stats("held")
        assert stats["memory-bytes"] <= 20_000 + 600
        assert stats["messages-paged"] >= 250

        def waits() -> list[dict]:
            return [e for e in logs if e["event"].startswith("reading from pages waits")]

        wait_for(waits, 10, what="the warning")
        assert len(waits()) == 1, logs
        (warning,) = waits()
        assert warning["log_level"] == "warning"
        assert warning["queue"] == "held" and warning["max_read_page_bytes"] == 20_000
        assert 20_000 - 600 <= warning["unsettled_bytes"] <= 20_000 + 600
        for _ in got:
            receiver.accept()
        rest = receive(receiver, 300 - len(got))
        assert ns(got + rest) == list(range(300))
    cursor = address_stats(broker, "held")["cursors"]["held"]
    assert cursor["reads-held-by-unsettled"] >= 1


def test_selector_consumer_reaches_matching_messages_behind_paged_ones(scow_broker):
    broker = paging_broker(scow_broker)
    blue = 20_000

    def make(i: int) -> Message:
        return Message(body="b", properties={"color": "red" if i >= blue else "blue", "n": i})

    bulk_send(broker.url, "colors", blue + 3, make)
    assert broker.queue_stats("colors")["messages-paged"] > blue - 100
    with connected(broker.url) as conn:
        red = conn.create_receiver("colors", options=[Selector("color = 'red'")], credit=10)
        assert ns(receive(red, 3, accept=True)) == [blue, blue + 1, blue + 2]
    stats = broker.queue_stats("colors")
    assert stats["message-count"] == blue
    assert stats["memory-bytes"] < 2 * 20 * 1024 * 1024
    with connected(broker.url) as conn:
        assert ns(receive(conn.create_receiver("colors", credit=500), 100)) == list(range(100))


def test_ttl_and_dead_letter_apply_to_paged_messages(scow_broker):
    broker = paging_broker(scow_broker)
    bulk_send(broker.url, "ttl", 30, lambda i: numbered(i, ttl=0.3) if i >= 20 else numbered(i))
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("ttl", credit=1)
        assert ns(receive(receiver, 1, accept=False)) == [0]
        receiver.reject()  # rejected: straight to the dead-letter address
    wait_for(lambda: broker.queue_stats("DLA") is not None, what="the DLA queue")
    time.sleep(0.4)  # the TTL of messages 20.. runs out while they sit in pages
    with connected(broker.url) as conn:
        got = ns(receive(conn.create_receiver("ttl", credit=50), 19))
        assert got == list(range(1, 20))
        assert ns(receive(conn.create_receiver("ExpiryQueue"), 10)) == list(range(20, 30))
        assert ns(receive(conn.create_receiver("DLA"), 1)) == [0]


def test_disk_monitor_blocks_producers_and_resumes_them(scow_broker):
    broker = scow_broker(sections={"broker": {"disk-scan-period": 50}})
    monitor = broker.call(
        lambda: next(s for s in broker.server.services if type(s).__name__ == "DiskMonitor")
    )
    with connected(broker.url) as conn:
        sender = conn.create_sender("d")
        sender.send(Message(body="before"))
        broker.call(lambda: setattr(monitor, "min_disk_free", 1 << 60))  # more than any disk
        wait_for(lambda: broker.call(lambda: broker.broker.limits.disk_full), what="disk full")
        credit = sender.link.credit
        for _ in range(credit):  # credit already given is honoured: nothing is refused
            sender.send(Message(body="in flight"))
        assert sender.link.credit == 0
        assert broker.queue_stats("d")["message-count"] == 1 + credit
        broker.call(lambda: setattr(monitor, "min_disk_free", -1))
        broker.call(lambda: setattr(monitor, "max_disk_usage", -1))
        pump([conn], lambda: sender.link.credit > 0, what="credit once the disk has room")
        sender.send(Message(body="after"))
    assert broker.queue_stats("d")["message-count"] == 2 + credit


def test_browser_sees_paged_messages_once_and_leaves_them(scow_broker):
    broker = paging_broker(scow_broker)
    bulk_send(broker.url, "catalog", 120, numbered)
    assert broker.queue_stats("catalog")["messages-paged"] > 100
    with connected(broker.url) as conn:
        browser = conn.create_receiver("catalog", credit=7, name="browser", options=Copy())
        seen = [browser.receive(timeout=10).properties["n"] for _ in range(120)]
        assert seen == list(range(120))
        # a consumer now reads the pages into memory: the browser is not shown them again
        consumer = conn.create_receiver("catalog", credit=5)
        assert ns(receive(consumer, 10, accept=False)) == list(range(10))
        with pytest.raises(Timeout):
            browser.receive(timeout=0.5)
    assert broker.queue_stats("catalog")["message-count"] == 120


def test_paged_messages_expired_when_read_leave_a_small_credit_for_the_live_ones(scow_broker):
    broker = paging_broker(scow_broker)
    expiring = range(20, 40)
    bulk_send(
        broker.url, "mixed", 50, lambda i: numbered(i, ttl=0.3) if i in expiring else numbered(i)
    )
    assert broker.queue_stats("mixed")["messages-paged"] >= 30  # all the expiring ones
    time.sleep(0.4)  # the TTL of messages 20..39 runs out while they sit in pages
    live = [i for i in range(50) if i not in expiring]
    with connected(broker.url) as conn:
        # the expired ones, read in the same batches, must not use up the 5 credits
        assert ns(receive(conn.create_receiver("mixed", credit=5), 30)) == live
        assert ns(receive(conn.create_receiver("ExpiryQueue"), 20)) == list(expiring)


def test_paged_messages_expire_without_a_consumer(scow_broker):
    broker = paging_broker(scow_broker)
    bulk_send(broker.url, "stale", 60, lambda i: numbered(i, ttl=0.2) if i % 2 else numbered(i))
    assert broker.queue_stats("stale")["messages-paged"] > 40
    wait_for(
        lambda: broker.queue_stats("stale")["messages-expired"] == 30,
        what="the expiry scan to move the 30 expired messages out of the pages",
    )
    assert broker.queue_stats("stale")["message-count"] == 30
    with connected(broker.url) as conn:
        assert ns(receive(conn.create_receiver("ExpiryQueue", credit=50), 30)) == list(
            range(1, 60, 2)
        )
        assert ns(receive(conn.create_receiver("stale", credit=50), 30)) == list(range(0, 60, 2))


def test_a_subscription_whose_filter_refuses_everything_does_not_keep_the_address_paging(
    scow_broker,
):
    broker = paging_broker(scow_broker)
    topic = [Capabilities("topic"), Durable()]
    with connected(broker.url, container_id="c") as conn:
        none = conn.create_receiver("mixed", name="none", options=[*topic, Selector("n < 0")])
        detach(conn, none, until=lambda: broker.queue_stats("c.none")["consumer-count"] == 0)
        everything = conn.create_receiver("mixed", name="all", options=topic, credit=10)
        bulk_send(broker.url, "mixed", 100, numbered)
        assert address_stats(broker, "mixed")["paging"]
        assert ns(receive(everything, 100)) == list(range(100))
        wait_for(lambda: not address_stats(broker, "mixed")["paging"], what="paging to end")


def typed_paging_broker(scow_broker, name: str, arguments: dict, **settings):
    return scow_broker(
        address_settings={"#": {**SMALL, **settings}},
        sections={"queues": {name: {"routing-type": "ANYCAST", "arguments": arguments}}},
    )


def taken_ahead(broker, queue: str) -> int:
    return broker.call(lambda: len(broker.broker.queues[queue].cursor.taken))


def test_a_high_priority_message_paged_behind_low_ones_is_delivered_first(scow_broker):
    broker = typed_paging_broker(scow_broker, "jobs", {"qpid.priorities": 10})
    bulk_send(broker.url, "jobs", 300, lambda i: numbered(i, priority=1))
    with connected(broker.url) as conn:
        send(conn, "jobs", numbered(1000, priority=9), numbered(1001, priority=5))
    assert broker.queue_stats("jobs")["messages-paged"] > 250  # both high ones are in pages
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("jobs", credit=0)
        # attached without credit: the cursor already takes them ahead of ~290 low ones
        wait_for(lambda: taken_ahead(broker, "jobs") == 2, what="the high ones taken ahead")
        receiver.flow(3)
        assert ns(receive(receiver, 3)) == [1000, 1001, 0]
    with connected(broker.url) as conn:
        rest = ns(receive(conn.create_receiver("jobs", credit=50), 299))
    assert rest == list(range(1, 300))


def stored_pages(broker, address: str) -> list[int]:
    """The pages the page store holds for `address`, whether or not it still exists."""

    def pages() -> list[int]:
        store = broker.broker.page_manager.open_store(address)
        try:
            return store.page_numbers()
        finally:
            store.close()

    return broker.call(pages)


def test_an_auto_deleted_paging_address_leaves_no_page_behind(scow_broker):
    """Found by the chaos schedules (benchmark seed 30): an address paging because the
    broker as a whole was full had its auto-created queue, then itself, deleted; its head
    page stayed on disk for good."""
    broker = scow_broker(
        sections={"broker": {"global-max-size": 20_000}},
        address_settings={"#": {"page-size-bytes": 8_000, "auto-delete-addresses": True}},
    )
    bulk_send(broker.url, "full", 40, numbered)  # fills the broker: every address pages
    bulk_send(broker.url, "gone", 5, numbered)
    assert broker.queue_stats("gone")["messages-paged"] == 5
    with connected(broker.url) as conn:
        assert ns(receive(conn.create_receiver("gone"), 5)) == list(range(5))
    wait_for(lambda: broker.call(lambda: "gone" not in broker.broker.addresses), what="deleted")
    wait_for(lambda: stored_pages(broker, "gone") == [], what="its pages deleted")


def test_an_address_deleted_and_created_again_while_the_broker_pages_keeps_paging(scow_broker):
    """Found by the 30-minute soak: an auto-created address deleted while paging left its
    pages, the address came back, its new pages started at 1 below them, and the page
    writer thread died on the refused append: every address stopped paging for good."""
    broker = scow_broker(
        sections={"broker": {"global-max-size": 20_000}},
        address_settings={"#": {"page-size-bytes": 8_000, "auto-delete-addresses": True}},
    )
    bulk_send(broker.url, "full", 40, numbered)  # fills the broker: every address pages
    for round_ in range(3):
        bulk_send(broker.url, "again", 20, numbered)
        with connected(broker.url) as conn:
            assert ns(receive(conn.create_receiver("again"), 20)) == list(range(20)), round_
        wait_for(lambda: broker.call(lambda: "again" not in broker.broker.addresses))
    bulk_send(broker.url, "other", 5, numbered)  # the writer still writes for everyone
    assert broker.queue_stats("other")["messages-paged"] == 5
    with connected(broker.url) as conn:
        assert ns(receive(conn.create_receiver("other"), 5)) == list(range(5))


def test_the_head_page_goes_once_paging_ends_whatever_the_order(scow_broker):
    """The last acknowledgement of the head page may come before the address leaves page
    mode: the page must go then, not wait for paging to start again."""
    broker = paging_broker(scow_broker)
    bulk_send(broker.url, "q", 40, numbered)
    with connected(broker.url) as conn:
        assert ns(receive(conn.create_receiver("q", credit=10), 40)) == list(range(40))
    wait_for(lambda: not address_stats(broker, "q")["paging"], what="paging ended")
    wait_for(lambda: stored_pages(broker, "q") == [], what="every page deleted")


def test_a_released_value_superseded_in_pages_meanwhile_is_dropped(scow_broker):
    broker = typed_paging_broker(
        scow_broker,
        "prices",
        {"last-value-key": "stock"},
        **{"max-size-bytes": 0, "max-read-page-messages": 1},
    )

    def tick(i: int) -> Message:
        return Message(body=f"{i}:{BODY}", properties={"stock": "A", "n": i}, durable=True)

    with connected(broker.url) as conn:
        send(conn, "prices", tick(1))
        receiver = conn.create_receiver("prices", credit=0)  # credit 1 per receive()
        assert ns(receive(receiver, 1, accept=False)) == [1]
        send(conn, "prices", tick(2))  # stays in pages (1 fills the read limit)
        receiver.release()  # 1 comes back, but 2 superseded it meanwhile
        assert ns(receive(receiver, 1)) == [2]

    def settled() -> bool:
        cursor = address_stats(broker, "prices")["cursors"]["prices"]
        return (cursor["messages-paged"], cursor["pages-pending"]) == (0, 0)

    wait_for(settled, what="both values acknowledged")


def test_a_paged_message_superseded_by_a_newer_value_is_never_delivered(scow_broker):
    broker = typed_paging_broker(
        scow_broker, "prices", {"last-value-key": "stock"}, **{"max-size-bytes": 0}
    )

    def tick(i: int) -> Message:
        return Message(body=f"{i}:{BODY}", properties={"stock": f"s{i % 5}", "n": i})

    bulk_send(broker.url, "prices", 300, tick)  # 60 values of each of 5 stocks, all paged
    assert broker.queue_stats("prices")["messages-paged"] == 300
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("prices", credit=10)
        got = ns(receive(receiver, 5))
        try:
            extra = receiver.receive(timeout=1)
        except Timeout:
            extra = None
    assert extra is None, extra.properties
    assert sorted(got) == [295, 296, 297, 298, 299]
    wait_for(lambda: broker.queue_stats("prices")["message-count"] == 0, what="all settled")


def test_a_burst_of_acknowledgements_ends_paging_and_frees_the_pages(scow_broker):
    """Acknowledgements settled together reach the broker in one read; the pages' counts
    and the end of page mode are worked out once for them all (once per loop pass), and
    a consumer and the next producer see what one acknowledgement at a time gave."""
    # every message may be read while none is acknowledged
    broker = paging_broker(scow_broker, **{"max-read-page-bytes": 1_000_000})
    bulk_send(broker.url, "burst", 100, numbered)
    assert address_stats(broker, "burst")["paging"]
    assert address_stats(broker, "burst")["page-count"] > 5
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("burst", credit=100)
        assert ns(receive(receiver, 100, accept=False)) == list(range(100))
        for _ in range(100):
            receiver.accept()  # no I/O in between: they go out together
        pump([conn], lambda: not address_stats(broker, "burst")["paging"], what="paging ended")
        wait_for(lambda: page_files(broker, "burst") == 0, what="every page deleted")
        assert address_stats(broker, "burst")["cursors"]["burst"]["pages-pending"] == 0
        written = address_stats(broker, "burst")["messages-written-to-pages"]
        send(conn, "burst", numbered(100))
        assert ns(receive(receiver, 1)) == [100]
    assert address_stats(broker, "burst")["messages-written-to-pages"] == written  # memory


def test_a_producer_blocked_at_max_size_bytes_goes_on_after_a_burst_of_acknowledgements(
    scow_broker,
):
    held = {"max-size-bytes": 5_000, "address-full-policy": "BLOCK"}
    broker = scow_broker(address_settings={"#": SMALL, "held": {**SMALL, **held}})
    with connected(broker.url) as conn:
        sender = conn.create_sender("held")
        sent = 0
        while sent == 0 or sender.link.credit > 0:  # until the full address stops credit
            sender.send(numbered(sent))
            sent += 1
        assert broker.queue_stats("held")["message-count"] == sent
        receiver = conn.create_receiver("held", credit=sent)
        assert ns(receive(receiver, sent, accept=False)) == list(range(sent))
        for _ in range(sent):
            receiver.accept()
        pump([conn], lambda: sender.link.credit > 0, what="credit once the acks freed memory")
        sender.send(numbered(sent))
        assert ns(receive(receiver, 1)) == [sent]
