"""Messages whose frames interleave on several links of one connection: each link's
message arrives whole, whatever the other links send or leave half sent.

proton reports a delivery's frames as events, merging only consecutive ones; when two
links' frames alternate, a message read whole on its first event has later events
still queued (see `ProducerLink.on_delivery`). The client here writes its links' frames
alternately to the socket, a piece per link per round, so that the broker reads several
links' frames in one go.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from proton import Message

from scow.core.testing import wait_for
from scow.protocols.amqp import engine

from .helpers import RawClient, consume_all
from .test_large_messages import SMALL_LARGE, body_of, files, large_broker

#: Bytes each link adds per round: a frame or so at the broker's max-frame-size below.
STEP = 4000


def _pieces(link: Any, messages: list[bytes], deliveries: list[Any]) -> Iterator[None]:
    """Send `messages` on `link` one after another, STEP bytes per step; a message's last
    piece ends its delivery."""
    for n, data in enumerate(messages):
        deliveries.append(engine.begin_send(link, b"%d" % n, b""))
        for start in range(0, len(data), STEP):
            engine.send_more(link, data[start : start + STEP])
            if start + STEP >= len(data):
                engine.link_advance(link)
            yield


def send_interleaved(client: RawClient, sends: list[tuple[Any, list[bytes]]]) -> list[Any]:
    """Send each link's messages, the links' pieces alternating on the socket; returns
    every delivery once the broker has answered them all."""
    deliveries: list[Any] = []
    steps = [_pieces(link, messages, deliveries) for link, messages in sends]
    for _ in itertools.zip_longest(*steps):
        client.read(0.001)
    client.until(lambda: all(engine.delivery_remote_state(d) for d in deliveries), "outcomes")
    return deliveries


def _outcomes(deliveries: list[Any]) -> list[int]:
    return [engine.delivery_remote_state(d) for d in deliveries]


def _encoded(body: bytes, n: int) -> bytes:
    return Message(body=body, durable=True, properties={"n": n}).encode()


def _senders(client: RawClient, sessions: int, address: str) -> list[Any]:
    second = client.session if sessions == 1 else engine.new_session(client.engine.connection)
    links = [
        engine.new_sender(client.session, "a", address),
        engine.new_sender(second, "b", address),
    ]
    client.until(lambda: all(engine.link_credit(link) > 0 for link in links), "credit")
    return links


def _broker(scow_broker: Any) -> Any:
    # small frames: a message below the threshold still takes several
    return large_broker(scow_broker, amqp={"max-frame-size": 4096})


@pytest.mark.parametrize("sessions", [1, 2], ids=["one-session", "two-sessions"])
def test_large_messages_interleaved_on_two_links_arrive_whole(scow_broker, sessions):
    broker = _broker(scow_broker)
    client = RawClient(broker.port)
    links = _senders(client, sessions, "both")
    bodies = [body_of(256 << 10, seed=i) for i in range(2)]
    sends = [
        (link, [_encoded(body, i)])
        for i, (link, body) in enumerate(zip(links, bodies, strict=True))
    ]
    deliveries = send_interleaved(client, sends)
    assert _outcomes(deliveries) == [engine.ACCEPTED] * 2
    client.close()
    got = consume_all(broker.url, "both", quiet=0.3)
    assert sorted((m.properties["n"], bytes(m.body)) for m in got) == list(enumerate(bodies))
    wait_for(lambda: not files(broker), 5, what="the files to go")


def test_small_messages_interleaved_with_a_large_one_arrive_whole_and_in_order(scow_broker):
    broker = _broker(scow_broker)
    client = RawClient(broker.port)
    small_link, large_link = _senders(client, 1, "mixed")
    small = [body_of(SMALL_LARGE - 4096, seed=i) for i in range(3)]  # a few frames each
    large = body_of(256 << 10, seed=9)
    deliveries = send_interleaved(
        client,
        [
            (small_link, [_encoded(body, i) for i, body in enumerate(small)]),
            (large_link, [_encoded(large, 9)]),
        ],
    )
    assert _outcomes(deliveries) == [engine.ACCEPTED] * 4
    client.close()
    got = consume_all(broker.url, "mixed", quiet=0.3)
    assert [bytes(m.body) for m in got if m.properties["n"] != 9] == small
    assert [bytes(m.body) for m in got if m.properties["n"] == 9] == [large]


def test_a_link_detached_mid_message_leaves_the_other_whole_and_its_file_removed(scow_broker):
    broker = _broker(scow_broker)
    client = RawClient(broker.port)
    left, kept = _senders(client, 1, "half")
    body = body_of(256 << 10, seed=1)
    encoded = _encoded(body, 1)
    half = _encoded(body_of(256 << 10, seed=2), 2)[: 32 * STEP]  # never ends
    engine.begin_send(left, b"0", b"")
    delivery = engine.begin_send(kept, b"0", b"")
    for start in range(0, len(half), STEP):
        engine.send_more(left, half[start : start + STEP])
        engine.send_more(kept, encoded[start : start + STEP])
        client.read(0.001)
    arriving = lambda: broker.call(broker.broker.stats)["large-messages"]["arriving"]  # noqa: E731
    wait_for(lambda: arriving() == 2, 5, what="both messages in their files")
    engine.detach_link(left)
    for start in range(len(half), len(encoded), STEP):
        engine.send_more(kept, encoded[start : start + STEP])
        client.read(0.001)
    engine.link_advance(kept)
    client.until(lambda: engine.delivery_remote_state(delivery), "the outcome")
    assert engine.delivery_remote_state(delivery) == engine.ACCEPTED
    assert arriving() == 0
    assert len(files(broker)) == 1  # the half message's file went with its link
    client.close()
    assert [bytes(m.body) for m in consume_all(broker.url, "half", quiet=0.3)] == [body]
    wait_for(lambda: not files(broker), 5, what="the file to go")
