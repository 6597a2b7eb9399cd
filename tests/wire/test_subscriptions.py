"""Topic subscriptions: durable ones that outlive their link, shared ones that split the load."""

from __future__ import annotations

import pytest
from proton import Message, Terminus

from scow.core.testing import wait_for

from .helpers import Capabilities, Durable, bodies, connected, detach, pump, receive, send

TOPIC = "events"


def durable_receiver(conn, name: str = "audit", durability: int = Terminus.DELIVERIES, **kw):
    return conn.create_receiver(
        TOPIC, name=name, options=[Capabilities("topic"), Durable(durability)], **kw
    )


def queue_exists(broker, name: str) -> bool:
    return broker.call(lambda: name in broker.broker.queues)


def consumers(broker, name: str) -> int:
    stats = broker.queue_stats(name)
    return stats["consumer-count"] if stats else -1


@pytest.mark.parametrize(
    "durability", [Terminus.DELIVERIES, Terminus.CONFIGURATION], ids=["deliveries", "configuration"]
)
def test_durable_subscription_keeps_messages_sent_while_detached(scow_broker, durability):
    broker = scow_broker()
    subscription = "app-1.audit"  # container id . link name
    with connected(broker.url, container_id="app-1") as conn:
        receiver = durable_receiver(conn, durability=durability)
        assert queue_exists(broker, subscription)
        send(conn, TOPIC, Message(body="before"))
        assert bodies(receive(receiver, 1)) == ["before"]
        detach(conn, receiver, until=lambda: consumers(broker, subscription) == 0)

        send(conn, TOPIC, Message(body="while away 1"), Message(body="while away 2"))
        assert broker.queue_stats(subscription)["message-count"] == 2

    with connected(broker.url, container_id="app-1") as conn:
        receiver = durable_receiver(conn, durability=durability)
        assert bodies(receive(receiver, 2)) == ["while away 1", "while away 2"]


def test_durable_subscription_survives_its_connection_closing(scow_broker):
    broker = scow_broker()
    with connected(broker.url, container_id="app-1") as conn:
        durable_receiver(conn)
    assert queue_exists(broker, "app-1.audit")
    with connected(broker.url) as producer:
        send(producer, TOPIC, Message(body="kept"))
    with connected(broker.url, container_id="app-1") as conn:
        assert bodies(receive(durable_receiver(conn), 1)) == ["kept"]


def test_closing_a_durable_subscription_link_removes_the_subscription(scow_broker):
    broker = scow_broker()
    with connected(broker.url, container_id="app-1") as conn:
        durable_receiver(conn).close()  # close, not detach: the subscription ends
        assert not queue_exists(broker, "app-1.audit")
        send(conn, TOPIC, Message(body="nobody listening"))

        receiver = durable_receiver(conn)
        send(conn, TOPIC, Message(body="after"))
        assert bodies(receive(receiver, 1)) == ["after"]
        pump(
            [conn],
            lambda: broker.queue_stats("app-1.audit")["message-count"] == 0,
            what="the subscription to hold nothing but the acknowledged message",
        )


def test_durable_subscriptions_of_different_clients_are_separate(scow_broker):
    broker = scow_broker()
    with connected(broker.url, container_id="app-1") as one:
        durable_receiver(one)
    with connected(broker.url, container_id="app-2") as two:
        durable_receiver(two)
        send(two, TOPIC, Message(body="to both"))
    assert broker.queue_stats("app-1.audit")["message-count"] == 1
    assert broker.queue_stats("app-2.audit")["message-count"] == 1


def _split(broker, receivers, conns, count: int) -> list[list[str]]:
    """Send `count` messages to the topic and collect what each receiver gets."""
    with connected(broker.url) as producer:
        send(producer, TOPIC, *(Message(body=f"job{i}") for i in range(count)))
    pump(
        conns,
        lambda: sum(r.fetcher.has_message for r in receivers) == count,
        what=f"{count} messages across the shared subscription",
    )
    got = []
    for receiver in receivers:
        got.append([receiver.fetcher.pop().body for _ in range(receiver.fetcher.has_message)])
    return got


@pytest.mark.parametrize(
    ("capabilities", "container_ids", "queue"),
    [
        (("topic", "shared"), ("app-1", "app-1"), "app-1.workers"),
        (("topic", "shared", "global"), ("app-1", "app-2"), "workers"),
    ],
    ids=["same-client", "global"],
)
def test_shared_subscription_gives_each_message_to_exactly_one_receiver(
    scow_broker, capabilities, container_ids, queue
):
    broker = scow_broker()
    count = 10
    with (
        connected(broker.url, container_id=container_ids[0]) as one,
        connected(broker.url, container_id=container_ids[1]) as two,
    ):
        receivers = [
            conn.create_receiver(
                TOPIC, name="workers", credit=count, options=Capabilities(*capabilities)
            )
            for conn in (one, two)
        ]
        assert consumers(broker, queue) == 2
        got = _split(broker, receivers, [one, two], count)
        everything = sorted(got[0] + got[1], key=lambda b: int(b[3:]))
        assert everything == [f"job{i}" for i in range(count)]  # each exactly once
        assert got[0] and got[1], got  # both receivers share the work


def test_shared_subscription_goes_when_its_last_receiver_leaves(scow_broker):
    broker = scow_broker()
    with connected(broker.url, container_id="app-1") as one:
        with connected(broker.url, container_id="app-1") as two:
            for conn in (one, two):
                conn.create_receiver(TOPIC, name="workers", options=Capabilities("topic", "shared"))
            assert consumers(broker, "app-1.workers") == 2
        pump([one], lambda: consumers(broker, "app-1.workers") == 1, what="one receiver left")
    wait_for(lambda: not queue_exists(broker, "app-1.workers"), what="the subscription to go")
