"""Broker-J's flow to disk: bodies past a threshold wait on disk, come back on delivery."""

from __future__ import annotations

from proton import Message

from scow.core.testing import DEFAULT_PLUGINS, wait_for
from tests.wire.helpers import bulk_send, connected, receive

KIB = "k" * 1024


def flow_broker(scow_broker, threshold: int, period: int = 60_000, **settings):
    return scow_broker(
        plugins=[*DEFAULT_PLUGINS, "flow-to-disk"],
        sections={
            "flow-to-disk": {
                "flow-to-disk-threshold": threshold,
                "housekeeping-check-period": period,
            },
            "broker": {"global-max-size": "1GiB"},  # no paging here: flow to disk alone
        },
        address_settings={"#": {"auto-delete-queues": False, **settings}},
    )


def figures(broker) -> dict:
    return broker.call(lambda: broker.broker.stats()["flow-to-disk"])


def numbered(i: int) -> Message:
    return Message(body=f"{i}:{KIB}", properties={"n": i})


def test_bodies_past_the_threshold_flow_to_disk_and_come_back_in_order(scow_broker):
    broker = flow_broker(scow_broker, threshold=64 * 1024)
    bulk_send(broker.url, "backlog", 500, numbered)
    stats = figures(broker)
    body = len(numbered(0).encode())  # what each message costs in memory, as stored
    assert stats["inMemoryMessageThreshold"] == 64 * 1024
    assert stats["bytesOnDisk"] > 400 * body  # all but ~64 KiB of 500 KiB went to disk
    assert 64 * 1024 - body < stats["inMemoryMessageSize"] <= 64 * 1024 + body
    assert stats["bytesEvacuatedFromMemory"] == stats["bytesOnDisk"]
    held = 500 * body
    assert abs(stats["bytesOnDisk"] + stats["inMemoryMessageSize"] - held) < 500 * 8
    with connected(broker.url) as conn:
        got = receive(conn.create_receiver("backlog", credit=50), 500)
    assert [m.properties["n"] for m in got] == list(range(500))
    assert all(m.body == f"{m.properties['n']}:{KIB}" for m in got)
    stats = figures(broker)
    assert stats["bytesOnDisk"] == 0
    assert stats["bytesRestoredToMemory"] == stats["bytesEvacuatedFromMemory"]
    wait_for(lambda: figures(broker)["inMemoryMessageSize"] == 0, what="all acknowledged")


def test_housekeeping_divides_the_threshold_between_queues_by_size(scow_broker):
    broker = flow_broker(scow_broker, threshold=10_000_000)  # nothing flows on arrival
    bulk_send(broker.url, "small", 100, numbered)
    bulk_send(broker.url, "large", 300, numbered)
    assert figures(broker)["bytesOnDisk"] == 0

    def housekeeping() -> int:
        flow = broker.broker.flow_to_disk.__self__  # the plugin's FlowToDisk
        flow.threshold = 100 * 1024
        return flow.housekeeping()

    sizes = {q: broker.queue_stats(q)["memory-bytes"] for q in ("small", "large")}
    moved = broker.call(housekeeping)
    targets = figures(broker)["queueTargets"]
    total = sum(sizes.values())
    assert targets == {q: 100 * 1024 * size // total for q, size in sizes.items()}
    assert targets["small"] + targets["large"] <= 100 * 1024
    in_memory = figures(broker)["inMemoryMessageSize"]
    assert in_memory <= 100 * 1024 and moved > 300
    with connected(broker.url) as conn:
        assert len(receive(conn.create_receiver("small", credit=20), 100)) == 100
        assert len(receive(conn.create_receiver("large", credit=20), 300)) == 300
    assert figures(broker)["bytesOnDisk"] == 0


def test_flow_to_disk_composes_with_paging(scow_broker):
    broker = scow_broker(
        plugins=[*DEFAULT_PLUGINS, "flow-to-disk"],
        sections={"flow-to-disk": {"flow-to-disk-threshold": 20 * 1024}},
        address_settings={"#": {"max-size-bytes": 60 * 1024, "auto-delete-queues": False}},
    )
    bulk_send(broker.url, "both", 400, numbered)
    queue = broker.queue_stats("both")
    assert queue["messages-paged"] > 300  # the address pages past its max-size-bytes
    assert figures(broker)["bytesOnDisk"] > 30 * 1024  # what it holds in memory flowed
    with connected(broker.url) as conn:
        got = receive(conn.create_receiver("both", credit=50), 400)
    assert [m.properties["n"] for m in got] == list(range(400))
