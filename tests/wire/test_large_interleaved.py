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
from cproton_ffi import lib
from proton import Described, Message, ulong

from scow.core.management import MANAGEMENT_ADDRESS
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


def send_interleaved(
    client: RawClient, sends: list[tuple[Any, list[bytes]]], *, at_once: bool = False
) -> list[Any]:
    """Send each link's messages, the links' pieces alternating on the socket, written
    round by round or (`at_once`) in one write, so that the broker reads many rounds at a
    time; returns every delivery once the broker has answered them all."""
    deliveries: list[Any] = []
    steps = [_pieces(link, messages, deliveries) for link, messages in sends]
    held = bytearray()
    for _ in itertools.zip_longest(*steps):
        if at_once:
            while out := client.engine.output():
                held += out
        else:
            client.read(0.001)
    client.sock.sendall(held)
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


def _coordinator(session: Any) -> Any:
    link = lib.pn_sender(session, b"txn")
    lib.pn_terminus_set_type(lib.pn_link_target(link), lib.PN_COORDINATOR)
    lib.pn_link_open(link)
    return link


DECLARED = 0x33
PAD = "p" * 40000  # takes ten frames

#: Three management requests (each creates a queue) or three transaction declares, each
#: taking several frames, and the outcome each gets.
CONTROLS = {
    "management": (
        lambda session: engine.new_sender(session, "manage", MANAGEMENT_ADDRESS),
        [
            Message(
                properties={"operation": "CREATE", "type": "queue", "name": f"made-{i}", "pad": PAD}
            )
            for i in range(3)
        ],
        engine.ACCEPTED,
    ),
    "coordinator": (
        _coordinator,
        [Message(properties={"pad": PAD}, body=Described(ulong(0x31), []))] * 3,
        DECLARED,
    ),
}


@pytest.mark.parametrize("control", list(CONTROLS))
def test_control_messages_interleaved_with_messages_are_each_handled_once(scow_broker, control):
    """The management and coordinator links meet the repeated event too: read as a new
    message, it skipped the next request (accepted unread) or rejected the declares."""
    broker = _broker(scow_broker)
    client = RawClient(broker.port)
    make, requests, outcome = CONTROLS[control]
    link = make(client.session)
    producer = engine.new_sender(client.session, "p", "ctl")
    client.until(lambda: engine.link_credit(link) > 0 < engine.link_credit(producer), "credit")
    small = [_encoded(body_of(STEP - 200, seed=i), i) for i in range(40)]
    sends = [(link, [r.encode() for r in requests]), (producer, small)]
    deliveries = send_interleaved(client, sends, at_once=True)
    assert sorted(_outcomes(deliveries)) == sorted([outcome] * 3 + [engine.ACCEPTED] * len(small))
    client.close()
    got = consume_all(broker.url, "ctl", quiet=0.3)
    assert [m.properties["n"] for m in got] == list(range(len(small)))
    if control == "management":
        made = broker.call(lambda: sorted(q for q in broker.broker.queues if q.startswith("made")))
        assert made == ["made-0", "made-1", "made-2"]
