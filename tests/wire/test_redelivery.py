"""Outcomes and redelivery: released, modified, rejected, abandoned, dead-lettered, expired."""

from __future__ import annotations

import time

import pytest
from proton import Message
from proton.utils import LinkDetached

from scow.core.testing import wait_for

from .helpers import bodies, connected, pump, receive, send, settle_modified


def annotations(message: Message) -> dict[str, object]:
    return {str(k): v for k, v in (message.annotations or {}).items()}


def stats(broker, queue: str) -> dict:
    return broker.queue_stats(queue) or {}


def test_released_message_goes_to_the_next_receiver_with_delivery_count_unchanged(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as first, connected(broker.url) as second:
        send(first, "work", Message(body="job"))
        taker = first.create_receiver("work")
        got = taker.receive(timeout=10)
        assert got.delivery_count == 0
        taker.release(delivered=False)
        pump([first], lambda: stats(broker, "work")["delivering-count"] == 0, what="release")

        again = second.create_receiver("work").receive(timeout=10)
        assert again.body == "job"
        assert again.delivery_count == 0


def test_modified_delivery_failed_increments_delivery_count(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        send(conn, "work", Message(body="job"))
        receiver = conn.create_receiver("work")
        assert receiver.receive(timeout=10).delivery_count == 0
        settle_modified(receiver, failed=True)
        again = receiver.receive(timeout=10)
        assert again.body == "job"
        assert again.delivery_count == 1
        settle_modified(receiver, failed=True)
        assert receiver.receive(timeout=10).delivery_count == 2


def test_modified_without_delivery_failed_keeps_delivery_count(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        send(conn, "work", Message(body="job"))
        receiver = conn.create_receiver("work")
        receiver.receive(timeout=10)
        settle_modified(receiver, failed=False)
        assert receiver.receive(timeout=10).delivery_count == 0


def test_unsettled_messages_of_a_closed_connection_go_to_another_consumer(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as producer:
        send(producer, "work", *(Message(body=f"job{i}") for i in range(3)))
    with connected(broker.url) as doomed:
        holder = doomed.create_receiver("work", credit=0)
        holder.link.flow(2)
        doomed.wait(lambda: holder.fetcher.has_message == 2, msg="two unsettled messages")
        assert stats(broker, "work")["delivering-count"] == 2
    # the connection closed without settling: both come back, counted as delivered once
    wait_for(lambda: stats(broker, "work")["delivering-count"] == 0, what="the give-back")
    with connected(broker.url) as survivor:
        got = receive(survivor.create_receiver("work", credit=3), 3)
    assert [(m.body, m.delivery_count) for m in got] == [("job0", 1), ("job1", 1), ("job2", 0)]


def test_what_a_closed_connection_left_unsettled_comes_back_in_order_to_a_waiting_consumer(
    scow_broker,
):
    """Given back one by one, each offered again at once, those whose new delivery count
    needs no journal write (not durable) reached a waiting consumer ahead of the durable
    ones before them, whose count waited for its write: job1, job3, ... then job0, ...
    Now they come back together, in order, once every count is durable."""
    broker = scow_broker()
    jobs = [Message(body=f"job{i}", durable=i % 2 == 0) for i in range(10)]
    with connected(broker.url) as producer, connected(broker.url) as survivor:
        send(producer, "work", *jobs)
        with connected(broker.url) as doomed:
            holder = doomed.create_receiver("work", credit=0)
            holder.link.flow(10)
            doomed.wait(lambda: holder.fetcher.has_message == 10, msg="ten unsettled messages")
            waiting = survivor.create_receiver("work", credit=10)
        got = receive(waiting, 10)
    assert [m.body for m in got] == [f"job{i}" for i in range(10)]
    assert {m.delivery_count for m in got} == {1}


def test_message_is_dead_lettered_after_max_delivery_attempts(scow_broker):
    broker = scow_broker(address_settings={"#": {"max-delivery-attempts": 2}})
    with connected(broker.url) as conn:
        send(conn, "fragile", Message(body="poison", properties={"k": 1}))
        receiver = conn.create_receiver("fragile")
        for attempt in range(2):
            assert receiver.receive(timeout=10).delivery_count == attempt
            settle_modified(receiver, failed=True)
        pump([conn], lambda: stats(broker, "fragile").get("message-count") == 0, what="DLA move")
        assert stats(broker, "fragile")["messages-killed"] == 1

        dead = receive(conn.create_receiver("DLA"), 1)[0]
    assert dead.body == "poison"
    assert dead.properties == {"k": 1}
    stamps = annotations(dead)
    assert stamps["x-opt-ORIG-ADDRESS"] == "fragile"
    assert stamps["x-opt-ORIG-QUEUE"] == "fragile"


def test_rejected_message_goes_to_the_dead_letter_address(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        send(conn, "picky", Message(body="unwanted"))
        receiver = conn.create_receiver("picky")
        receiver.receive(timeout=10)
        receiver.reject()
        dead = receive(conn.create_receiver("DLA"), 1)[0]
        assert dead.body == "unwanted"
        assert annotations(dead)["x-opt-ORIG-ADDRESS"] == "picky"
        assert stats(broker, "picky")["message-count"] == 0


def test_expired_message_moves_to_the_expiry_queue_and_is_not_delivered(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        send(conn, "perishable", Message(body="stale", ttl=0.2), Message(body="fresh"))
        wait_for(
            lambda: stats(broker, "ExpiryQueue").get("message-count") == 1,
            what="the expiry scan to move the message",
        )
        assert stats(broker, "perishable")["messages-expired"] == 1
        # the first message the original queue hands out is the one that did not expire
        assert bodies(receive(conn.create_receiver("perishable"), 1)) == ["fresh"]

        expired = receive(conn.create_receiver("ExpiryQueue"), 1)[0]
    assert expired.body == "stale"
    stamps = annotations(expired)
    assert stamps["x-opt-ORIG-ADDRESS"] == "perishable"
    assert "x-opt-ACTUAL-EXPIRY" in stamps


def test_message_expiring_while_a_consumer_waits_is_not_delivered(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        # attached consumer without credit: the message waits in the queue and expires there
        receiver = conn.create_receiver("perishable", credit=0)
        send(conn, "perishable", Message(body="stale", ttl=0.2))
        wait_for(lambda: stats(broker, "ExpiryQueue").get("message-count") == 1, what="expiry")
        send(conn, "perishable", Message(body="fresh"))
        assert receiver.receive(timeout=10).body == "fresh"


def test_redelivery_delay_holds_a_failed_message_back(scow_broker):
    broker = scow_broker(address_settings={"#": {"redelivery-delay": 600}})
    with connected(broker.url) as conn:
        conn.create_sender("slow").send(Message(body="s"))
        receiver = conn.create_receiver("slow")
        receiver.receive(timeout=10)
        failed_at = time.monotonic()
        settle_modified(receiver, failed=True)
        again = receiver.receive(timeout=10)
        assert again.delivery_count == 1
        assert time.monotonic() - failed_at >= 0.5
        receiver.accept()


def test_default_max_consumers_limits_auto_created_queues(scow_broker):
    broker = scow_broker(address_settings={"#": {"default-max-consumers": 1}})
    with connected(broker.url) as conn:
        conn.create_receiver("single")
        with pytest.raises(LinkDetached) as refused:
            conn.create_receiver("single", name="second")
        assert "max-consumers" in str(refused.value)


def test_auto_delete_queues_delay_keeps_an_unused_queue_for_a_while(scow_broker):
    broker = scow_broker(address_settings={"#": {"auto-delete-queues-delay": 500}})
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("lingering")
        receiver.close()
    assert broker.queue_stats("lingering") is not None  # still there right after
    wait_for(lambda: broker.queue_stats("lingering") is None, what="the delayed auto-delete")
