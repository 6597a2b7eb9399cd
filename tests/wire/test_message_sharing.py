"""A message is stored once: every queue that holds it shares one object, and a waiting
message costs no per-queue object until it is delivered."""

from __future__ import annotations

from proton import Message

from scow.core.message import MEMORY_OVERHEAD, REF_OVERHEAD, MessageRef
from scow.core.message import Message as Held

from .helpers import Capabilities, Durable, bodies, connected, detach, receive, send


def entries(broker, queue: str) -> list:
    return broker.call(lambda: list(broker.broker.queues[queue]._messages))


def consumers(broker, queue: str) -> int:
    return broker.queue_stats(queue)["consumer-count"]


def memory(broker) -> tuple[int, int]:
    return broker.call(lambda: (broker.broker.limits.size, broker.broker.limits.messages))


def address_memory(broker, name: str) -> int:
    return broker.call(lambda: broker.broker.addresses[name].size)


def test_a_multicast_message_is_one_object_in_every_subscription(scow_broker):
    broker = scow_broker()
    names = ["a", "b", "c"]
    with connected(broker.url, container_id="app") as conn:
        receivers = {
            name: conn.create_receiver(
                "news", name=name, options=[Capabilities("topic"), Durable()]
            )
            for name in names
        }
        for name, receiver in receivers.items():
            detach(conn, receiver, until=lambda n=name: consumers(broker, f"app.{n}") == 0)
        send(conn, "news", Message(body="one"), Message(body="two"))

        held = [entries(broker, f"app.{name}") for name in names]
        assert [len(h) for h in held] == [2, 2, 2]
        for position in range(2):
            first = held[0][position]
            assert type(first) is not MessageRef and isinstance(first, Held)
            assert all(h[position] is first for h in held)  # the same object, not copies
        assert memory(broker)[1] == 2

        for name in names:
            again = conn.create_receiver(
                "news", name=name, options=[Capabilities("topic"), Durable()]
            )
            assert bodies(receive(again, 2)) == ["one", "two"]
    assert memory(broker) == (0, 0)  # freed once the last subscription acknowledged


def test_a_waiting_message_is_held_without_a_reference_until_delivered(scow_broker):
    broker = scow_broker()
    with connected(broker.url) as conn:
        send(conn, "work", *(Message(body=f"job{i}") for i in range(3)))
        waiting = entries(broker, "work")
        assert [type(e) for e in waiting] == [type(waiting[0])] * 3
        assert not isinstance(waiting[0], MessageRef)

        receiver = conn.create_receiver("work")
        got = receive(receiver, 3, accept=False)
        assert bodies(got) == ["job0", "job1", "job2"]
        receiver.close()  # released: each comes back as a reference with its count
    with connected(broker.url) as conn:
        again = receive(conn.create_receiver("work"), 3)
        assert bodies(again) == ["job0", "job1", "job2"]
        assert [m.delivery_count for m in again] == [1, 1, 1]


def test_a_message_in_many_subscriptions_counts_each_ones_slot_in_memory(scow_broker):
    """Memory limits count each further queue's slot for a shared message: with 200
    subscriptions, 128 MiB of counted 1 KiB messages took 410 MiB while each counted once
    (the broker's memory bound was a third of its memory)."""
    broker = scow_broker()
    names = [f"s{n}" for n in range(50)]
    with connected(broker.url, container_id="app") as conn:
        for name in names:
            receiver = conn.create_receiver(
                "news", name=name, options=[Capabilities("topic"), Durable()]
            )
            detach(conn, receiver, until=lambda n=name: consumers(broker, f"app.{n}") == 0)
        sent = [Message(body=f"news{i}") for i in range(4)]
        send(conn, "news", *sent)
        stored = [len(m.data) for m in entries(broker, "app.s0")]
        one_queue = sum(stored) + 4 * MEMORY_OVERHEAD
        assert memory(broker) == (one_queue + 4 * 49 * REF_OVERHEAD, 4)
        assert address_memory(broker, "news") == memory(broker)[0]

        for name in names:  # each subscription takes them; the last frees them
            again = conn.create_receiver(
                "news", name=name, options=[Capabilities("topic"), Durable()]
            )
            assert len(receive(again, 4)) == 4
    assert memory(broker) == (0, 0)
    assert address_memory(broker, "news") == 0
