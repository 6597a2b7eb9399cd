"""Qpid's paged queues (`qpid.paging = true`, plugin qpid-paged-queues) over real sockets:
a backlog far larger than the loaded pages in order within the bound, released messages
whose pages are gone, the page size limit, Qpid's limits and policies, restart and deletion
of the page file."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from proton import Delivery, Message
from proton.reactor import Copy, Selector

from scow.core.testing import DEFAULT_PLUGINS
from scow.plugins.queues.qpid_paged import HEADER, escaped_file_name

from .helpers import bodies, bulk_send, connected, drain, pump, receive, send
from .test_config_errors import run_rejected

PLUGIN = "qpid-paged-queues"
PLUGINS = [*DEFAULT_PLUGINS, PLUGIN]
PAGE = os.sysconf("SC_PAGE_SIZE")
KIB = "k" * 1000  # with its AMQP framing, about 1 KiB a message: 3 records per 4 KiB page


def paged(name: str = "q", **arguments: Any) -> dict[str, Any]:
    return {
        "queues": {
            name: {"routing-type": "ANYCAST", "arguments": {"qpid.paging": True, **arguments}}
        }
    }


def started(scow_broker: Any, name: str = "q", **arguments: Any) -> Any:
    return scow_broker(plugins=PLUGINS, sections=paged(name, **arguments))


def send_one(conn: Any, address: str, message: Message) -> Delivery:
    """Send and wait for the outcome, refused or not."""
    sender = conn.create_sender(address)
    try:
        return sender.send(message, error_states=[])
    finally:
        sender.close()


def consume(url: str, count: int, prefix: int, address: str = "q") -> list[str]:
    """Receive and accept exactly `count` messages; the first `prefix` characters of each."""
    with connected(url) as conn:
        receiver = conn.create_receiver(address, credit=min(count, 200))
        return [m.body[:prefix] for m in receive(receiver, count)]


def page_file(broker: Any, name: str = "q") -> Path:
    return Path(broker.queue_stats(name)["page-file"])


def test_a_backlog_of_a_thousand_pages_comes_out_in_order_with_two_loaded(scow_broker):
    broker = started(scow_broker, **{"qpid.max_pages_loaded": 2, "qpid.page_factor": 1})
    count = 3000  # about 1000 pages: 500 times what the two loaded pages hold
    bulk_send(broker.url, "q", count, lambda i: Message(body=f"{i:05d}{KIB}"))
    stats = broker.queue_stats("q")
    assert stats["message-count"] == count
    assert stats["page-size"] == PAGE
    assert stats["pages"] >= count // 3 - 1
    assert stats["pages-loaded"] <= 2
    assert stats["messages-in-memory"] <= 2 * (PAGE // 1000)
    assert stats["page-writes"] >= stats["pages"] - 2
    # the broker's memory books hold what is in memory, not the backlog in the file
    address = broker.call(lambda: broker.broker.address_stats(broker.broker.addresses["q"]))
    assert address["messages-in-memory"] <= 2 * (PAGE // 1000)
    assert os.path.getsize(page_file(broker)) >= (stats["pages"] - 2) * PAGE

    assert consume(broker.url, count, 5) == [f"{i:05d}" for i in range(count)]
    stats = broker.queue_stats("q")
    assert stats["message-count"] == 0 and stats["pages"] == 0
    assert 1 <= stats["pages-loaded-peak"] <= 2  # the bound held all along
    assert stats["page-reads"] >= count // 3 - 2  # nearly every page was read back once
    assert os.path.getsize(page_file(broker)) == 0  # emptied: the file gives its space back
    address = broker.call(lambda: broker.broker.address_stats(broker.broker.addresses["q"]))
    assert address["memory-bytes"] == 0 and address["messages-in-memory"] == 0


def test_released_messages_whose_pages_are_gone_come_back_in_order(scow_broker):
    broker = started(scow_broker, **{"qpid.max_pages_loaded": 2})
    count = 300
    bulk_send(broker.url, "q", count, lambda i: Message(body=f"{i:03d}{KIB}"))
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("q", credit=60)
        first = receive(receiver, 60, accept=False)
        assert [m.body[:3] for m in first] == [f"{i:03d}" for i in range(60)]
        # the 20 pages those came from are read and freed; later pages were evicted meanwhile
        assert broker.queue_stats("q")["pages"] < count // 3 - 15
        for i in range(60):  # the consumer keeps the even ones and gives the odd ones back
            if i % 2:
                receiver.release(delivered=False)
            else:
                receiver.accept()
        receiver.close()
    assert broker.queue_stats("q")["pages-loaded-peak"] <= 2
    expected = [f"{i:03d}" for i in [*range(1, 60, 2), *range(60, count)]]
    assert consume(broker.url, len(expected), 3) == expected
    assert broker.queue_stats("q")["message-count"] == 0


def test_browsers_and_selectors_see_the_pages_in_order_within_the_bound(scow_broker):
    broker = started(scow_broker, **{"qpid.max_pages_loaded": 2})
    count = 300

    def make(i: int) -> Message:
        return Message(body=f"{i:03d}{KIB}", properties={"red": i % 10 == 0})

    bulk_send(broker.url, "q", count, make)
    with connected(broker.url) as conn:
        browser = conn.create_receiver("q", credit=count, name="browser", options=Copy())
        seen = [m.body[:3] for m in receive(browser, count, accept=False)]
        assert seen == [f"{i:03d}" for i in range(count)]  # read from the file, not loaded
        assert broker.queue_stats("q")["message-count"] == count
        reds = conn.create_receiver("q", credit=count, name="reds", options=Selector("red"))
        got = [m.body[:3] for m in receive(reds, count // 10)]
        assert got == [f"{i:03d}" for i in range(0, count, 10)]
    assert broker.queue_stats("q")["pages-loaded-peak"] <= 2
    expected = [f"{i:03d}" for i in range(count) if i % 10]
    assert consume(broker.url, len(expected), 3) == expected
    assert broker.queue_stats("q")["message-count"] == 0


def test_a_message_larger_than_a_page_is_refused_and_others_keep_flowing(scow_broker):
    broker = started(scow_broker, **{"qpid.page_factor": 1})
    fits = PAGE - HEADER.size  # the largest message a page holds after the record header
    overhead = len(Message(body=b"x" * 1000).encode()) - 1000  # a binary body over 255 bytes
    with connected(broker.url) as conn:
        largest = Message(body=b"x" * (fits - overhead))
        assert len(largest.encode()) == fits
        too_large = Message(body=b"x" * (fits - overhead + 1))
        refused = send_one(conn, "q", too_large)
        assert refused.remote_state == Delivery.REJECTED
        condition = refused.remote.condition
        assert condition.name == "amqp:resource-limit-exceeded"
        assert condition.description.startswith(
            f"message of {fits + 1} bytes is larger than the page size {PAGE} "
            "of qpid-paged queue 'q'"
        )
        assert send_one(conn, "q", largest).remote_state == Delivery.ACCEPTED
        send(conn, "q", Message(body="after"))
        got = receive(conn.create_receiver("q"), 2)
    assert [len(got[0].body), got[1].body] == [fits - overhead, "after"]
    assert broker.queue_stats("q")["messages-added"] == 2  # the refused one was never queued


def test_paging_cannot_be_combined_with_priorities_at_startup(tmp_path):
    enable = ", ".join(f'"{p}"' for p in PLUGINS)
    stderr = run_rejected(
        tmp_path,
        f"[plugins]\nenable = [{enable}]\n"
        '[queues."q"]\narguments = { "qpid.priorities" = 10, "qpid.paging" = true }\n',
    )
    # qpidd says "Cannot specify qpid.priorities and qpid.paging for the same queue"; the
    # broker names the two selecting arguments in the order its queue types registered
    assert re.search(
        r"queue 'q': cannot specify (qpid\.priorities and qpid\.paging|qpid\.paging and "
        r"qpid\.priorities) for the same queue",
        stderr,
    ), stderr


def test_arguments_are_checked_and_named(scow_broker):
    broker = scow_broker(plugins=PLUGINS)

    def refused(arguments: dict[str, Any]) -> str:
        def declare() -> str:
            try:
                broker.broker.declare_queue("bad", routing_type="ANYCAST", arguments=arguments)
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            return "accepted"

        return broker.call(declare)

    assert refused({"qpid.paging": "FALSE"}) == (
        "InvalidField: queue 'bad': qpid.paging = false: a qpid-paged queue needs it true; "
        "leave it out for a standard queue"
    )
    both = refused({"qpid.paging": True, "last-value-key": "k"})
    assert "cannot specify" in both and "last-value-key" in both and "qpid.paging" in both
    assert "qpid.max_pages_loaded = -1: expected an integer from 0" in refused(
        {"qpid.paging": 1, "qpid.max_pages_loaded": -1}
    )
    assert "qpid.policy_type = 'flow_to_disk': expected one of reject, ring" in refused(
        {"qpid.paging": "True", "qpid.policy_type": "flow_to_disk"}
    )
    # Variant-like booleans and qpidd's 0 defaults
    assert refused({"qpid.paging": "tRuE", "qpid.max_pages_loaded": 0}) == "accepted"
    stats = broker.queue_stats("bad")
    assert (stats["max-pages-loaded"], stats["page-size"]) == (4, PAGE)


def test_reject_policy_refuses_at_max_count_until_a_message_leaves(scow_broker):
    broker = started(scow_broker, **{"qpid.max_count": 5})
    with connected(broker.url) as conn:
        send(conn, "q", *(Message(body=f"m{i}") for i in range(5)))
        refused = send_one(conn, "q", Message(body="m5"))
        assert refused.remote_state == Delivery.REJECTED
        assert refused.remote.condition.name == "amqp:resource-limit-exceeded"
        assert "qpid-paged queue 'q' is full: 5 messages, qpid.max_count 5" in (
            refused.remote.condition.description
        )
        receiver = conn.create_receiver("q")
        assert bodies(receive(receiver, 1)) == ["m0"]
        pump([conn], lambda: broker.queue_stats("q")["message-count"] == 4, what="the ack")
        send(conn, "q", Message(body="m6"))
        assert bodies(receive(receiver, 5)) == ["m1", "m2", "m3", "m4", "m6"]


def test_reject_policy_on_max_size(scow_broker):
    broker = started(scow_broker, **{"qpid.max_size": 2500})
    with connected(broker.url) as conn:
        send(conn, "q", Message(body=KIB), Message(body=KIB))
        refused = send_one(conn, "q", Message(body=KIB))
        assert refused.remote_state == Delivery.REJECTED
        assert "exceed qpid.max_size 2500 (qpid.policy_type reject)" in (
            refused.remote.condition.description
        )
    assert broker.queue_stats("q")["message-count"] == 2


def test_ring_policy_drops_the_oldest_waiting_messages(scow_broker):
    broker = started(
        scow_broker,
        **{"qpid.max_count": 5, "qpid.policy_type": "ring", "qpid.max_pages_loaded": 1},
    )
    bulk_send(broker.url, "q", 40, lambda i: Message(body=f"{i:02d}{KIB}"))
    stats = broker.queue_stats("q")
    assert (stats["message-count"], stats["messages-acknowledged"]) == (5, 35)
    assert stats["pages-loaded-peak"] == 1
    assert consume(broker.url, 5, 2) == ["35", "36", "37", "38", "39"]
    assert broker.queue_stats("q")["message-count"] == 0


def test_deleting_the_queue_deletes_its_page_file(scow_broker):
    broker = started(scow_broker, "orders/eu", **{"qpid.max_pages_loaded": 1})
    path = page_file(broker, "orders/eu")
    assert path.name == "pf_orders%47eu" == escaped_file_name("orders/eu")
    assert path.parent == Path(broker.broker.config.section("broker")["data-dir"]) / "pq"
    bulk_send(broker.url, "orders/eu", 30, lambda i: Message(body=KIB))
    assert path.stat().st_size > 0
    broker.call(lambda: broker.broker.delete_queue("orders/eu"))
    assert not path.exists()
    assert broker.queue_stats("orders/eu") is None


def test_a_durable_paged_queue_after_a_crash_and_a_clean_stop(scow_broker_process):
    plugins = ["amqp", "file-journal", "standard-queues", "full-policies", PLUGIN]
    sections = paged(**{"qpid.max_pages_loaded": 2})
    broker = scow_broker_process(plugins=plugins, sections=sections)
    bulk_send(broker.url, "q", 90, lambda i: Message(body=f"d{i:02d}{KIB}", durable=True))
    with connected(broker.url) as conn:
        send(conn, "q", Message(body="transient", durable=False))
    path = Path(broker.config_path.parent / "data" / "pq" / "pf_q")
    assert path.stat().st_size > 0
    broker.kill()
    with path.open("ab") as stale:  # whatever a crashed broker left is not read back
        stale.write(b"STALE" * 10_000)
    restarted = scow_broker_process(plugins=plugins, sections=sections, port=broker.port)
    assert b"STALE" not in path.read_bytes()  # created afresh, paged again by recovery
    assert 0 < path.stat().st_size < 40 * PAGE
    # the durable ones, in order; the transient one is gone (the file is not persistence)
    assert consume(restarted.url, 90, 3) == [f"d{i:02d}" for i in range(90)]
    with connected(restarted.url) as conn:
        assert drain(conn, conn.create_receiver("q", credit=0), 10) == []
    assert restarted.stop() == 0
    assert not path.exists()  # a clean stop deletes the page file
