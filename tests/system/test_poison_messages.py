"""Malformed messages from a buggy client library, as `scow run` meets them (the sender
and a consumer that rejects what it cannot read are processes of their own).

The broker takes a message's bytes as they come and reads only what it needs, so a
message whose sections are nonsense can be accepted and stored. Before, the first
consumer with a selector on such a queue had its connection aborted; the consumer it had
attached stayed on the queue, and the next consumer's attach delivered to the dead
link's freed memory: the broker died of a segmentation fault. Browsing the queue in the
management API answered 500. A message that cannot be read now matches no selector, is
browsed as `unreadable`, and is delivered, dead-lettered and recovered as bytes.
"""

from __future__ import annotations

import json
import subprocess
import sys

from proton import Timeout
from proton.reactor import Selector

from scow.core.testing import amqp_client, wait_for
from tests.system.topology import BrokerSpec

QUEUE = "poisoned"
COUNT = 400
GOOD = COUNT // 10  # every tenth is well-formed, with color = 'red'


def _client(broker, *args: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.system.poison", args[0], broker.url, *args[1:]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _count(broker, queue: str) -> int:
    return broker.api(f"/api/queues/{queue}")["message-count"]


def test_malformed_messages_never_cost_a_consumer_or_the_broker(system_broker):
    anycast = {"routing-type": "ANYCAST"}
    broker = system_broker(
        BrokerSpec(
            queues={QUEUE: anycast, "DLQ": anycast},
            address_settings={QUEUE: {"dead-letter-address": "DLQ", "max-delivery-attempts": 1}},
        )
    )
    outcomes = _client(broker, "send", QUEUE, str(COUNT), "7")
    stored = outcomes.get("accepted", 0)
    assert sum(outcomes.values()) == COUNT and stored >= GOOD, outcomes
    assert _count(broker, QUEUE) == stored

    for _ in range(2):  # a consumer with a selector, then another one
        with amqp_client(broker) as conn:
            receiver = conn.create_receiver(QUEUE, credit=GOOD, options=Selector("color = 'red'"))
            bodies = []
            try:
                while True:
                    bodies.append(receiver.receive(timeout=3).body)
                    receiver.accept()
            except Timeout:
                pass
        assert len(bodies) in (GOOD, 0) and all(b.startswith("good ") for b in bodies), bodies
    assert _count(broker, QUEUE) == stored - GOOD

    browsed = broker.api(f"/api/queues/{QUEUE}/messages?limit={COUNT}")
    assert len(browsed) == stored - GOOD
    unreadable = [m for m in browsed if m.get("unreadable")]
    assert unreadable and all("cannot be decoded" in m["unreadable"] for m in unreadable)

    assert _client(broker, "reject", QUEUE, str(stored - GOOD)) == {"rejected": stored - GOOD}
    wait_for(lambda: _count(broker, "DLQ") == stored - GOOD, 10)
    assert _count(broker, QUEUE) == 0

    assert broker.stop() == 0
    broker.start()
    assert _count(broker, "DLQ") == stored - GOOD  # recovered as they were stored
    assert not broker.log_lines("connection failed", "Traceback")


def test_malformed_messages_in_a_stream_are_read_as_they_came(system_broker):
    """A stream annotates each delivery with its sequence number: a malformed message's
    own annotations could not take them, and its reader's connection failed there."""
    stream = {"routing-type": "ANYCAST", "arguments": {"x-queue-type": "stream"}}
    broker = system_broker(BrokerSpec(queues={QUEUE: stream}))
    outcomes = _client(broker, "send", QUEUE, str(COUNT), "11")
    stored = outcomes.get("accepted", 0)
    assert stored >= GOOD, outcomes
    assert _client(broker, "read-stream", QUEUE, str(stored)) == {"read": stored}
    assert not broker.log_lines("connection failed", "Traceback")
