"""Limits: connections (broker and per user), sessions, links, unsettled, partial messages.

Past each limit the peer gets a clear AMQP error and everyone else is served.
"""

from __future__ import annotations

import socket

import pytest
from proton import ConnectionException, Message

from scow.core.testing import wait_for
from tests.security import frames
from tests.wire.helpers import (
    AMQP_HEADER,
    close_condition,
    connected,
    exchange,
    performatives,
    round_trip,
)

PLAIN = {"allowed_mechs": "PLAIN", "allow_insecure_mechs": True}


def test_max_connections_refuses_the_next_with_resource_limit_exceeded(secured):
    broker = secured(security={"max-connections": 2})
    with connected(broker.url), connected(broker.url):
        reply = exchange(broker.broker.port, AMQP_HEADER + frames.open_(), timeout=5)
        condition, description = close_condition(reply)
        assert condition == "amqp:resource-limit-exceeded"
        assert "max-connections (2)" in description
    round_trip(broker.url)  # the two went away: room again
    assert any(r.get("limit") == "max-connections" for r in broker.audit())


def test_a_socket_past_what_the_open_file_limit_leaves_is_closed_at_once(scow_broker):
    broker = scow_broker()
    security = broker.broker.security
    assert security.max_sockets > 100  # the open-file limit less storage's reserve
    security.max_sockets = 1
    with connected(broker.url):
        with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as extra:
            assert extra.recv(64) == b""  # closed, nothing said
        assert broker.call(lambda: (security.sockets, security.sockets_refused)) == (1, 1)
    wait_for(lambda: broker.call(lambda: security.sockets) == 0, 10)
    round_trip(broker.url)  # the first one's socket was given back


def test_max_connections_per_user(secured):
    broker = secured(
        users={"alice": ("a", []), "bob": ("b", [])},
        security={"max-connections-per-user": 1, "allow-anonymous": False},
    )
    with connected(broker.url, user="alice", password="a", **PLAIN):
        with (
            pytest.raises(ConnectionException) as refused,
            connected(broker.url, user="alice", password="a", **PLAIN),
        ):
            pass
        assert "amqp:resource-limit-exceeded" in str(refused.value)
        assert "user 'alice' has its max-connections-per-user (1)" in str(refused.value)
        round_trip(broker.url, user="bob", password="b", **PLAIN)  # others are served
    round_trip(broker.url, user="alice", password="a", **PLAIN)


def test_max_sessions_per_connection_ends_the_extra_session(secured):
    broker = secured(amqp={"max-sessions-per-connection": 2})
    data = AMQP_HEADER + frames.open_() + b"".join(frames.begin(ch) for ch in range(3))
    reply = exchange(broker.broker.port, data + frames.close(), timeout=5)
    ended = frames.errors(performatives(reply), frames.END)
    assert ended == [
        (
            "amqp:resource-limit-exceeded",
            "the connection has its max-sessions-per-connection (2) open",
        )
    ]
    assert close_condition(reply) == (None, None)  # the connection itself was fine
    round_trip(broker.url)


def test_max_links_per_connection_refuses_the_extra_attach(secured):
    broker = secured(amqp={"max-links-per-connection": 2})
    attaches = b"".join(frames.attach_sender(0, h, f"lim.{h}") for h in range(3))
    data = AMQP_HEADER + frames.open_() + frames.begin(0) + attaches + frames.close()
    reply = exchange(broker.broker.port, data, timeout=5)
    detached = frames.errors(performatives(reply), frames.DETACH)
    assert detached == [
        (
            "amqp:resource-limit-exceeded",
            "the connection has its max-links-per-connection (2) attached",
        )
    ]
    round_trip(broker.url)


def test_max_unsettled_per_link_holds_deliveries_whatever_the_credit(secured):
    broker = secured(amqp={"max-unsettled-per-link": 3})
    with connected(broker.url) as conn:
        sender = conn.create_sender("unsettled")
        for i in range(10):
            sender.send(Message(body=i))
        receiver = conn.create_receiver("unsettled", credit=10)
        stats = lambda: broker.broker.queue_stats("unsettled")  # noqa: E731
        wait_for(lambda: stats()["delivering-count"] == 3, what="three deliveries")
        round_trip(broker.url)  # the broker has handled the flow by now
        assert stats()["delivering-count"] == 3
        assert receiver.receive(timeout=10).body == 0
        receiver.accept()  # one settled: one more may come
        conn.wait(lambda: stats()["messages-acknowledged"] == 1, timeout=10, msg="the ack")
        wait_for(lambda: stats()["delivering-count"] == 3, what="the next delivery")
        got = [receiver.receive(timeout=10).body for _ in range(3)]
        assert got == [1, 2, 3]


def test_partial_messages_of_a_connection_are_bounded_by_max_message_size(secured):
    broker = secured(amqp={"max-message-size": 10_000, "max-frame-size": 4096})
    chunk = b"x" * 3000
    body = b"y" * 9100
    whole = b"\x00\x53\x75\xb0" + len(body).to_bytes(4, "big") + body  # one data section
    raw = frames.RawConnection(broker.broker.port)
    raw.send(
        AMQP_HEADER
        + frames.open_()
        + frames.begin(0)
        + frames.attach_sender(0, 0, "partial.a")
        + frames.attach_sender(0, 1, "partial.b")
    )
    raw.wait(lambda got: frames.count(frames.FLOW)(got) >= 2, "credit for both links")
    raw.send(  # link 0: 9000 bytes, still arriving
        frames.transfer(0, 0, 0, whole[:3000], more=True)
        + frames.transfer(0, 0, None, whole[3000:6000], more=True)
        + frames.transfer(0, 0, None, whole[6000:9000], more=True)
    )
    server = broker.broker.server.protocols["amqp"]
    held = lambda: broker.broker.call(lambda: [c.partial_bytes for c in server.connections])  # noqa: E731
    wait_for(lambda: held() == [9000], what="link 0's partial message to be held")
    # link 1 starts its own: 12000 bytes on the connection, over the bound
    raw.send(frames.transfer(0, 1, 1, chunk, more=True))
    raw.wait(lambda got: frames.count(frames.DETACH)(got) >= 1, "link 1 detached")
    # link 0 carries on and finishes: its message is routed whole
    raw.send(frames.transfer(0, 0, None, whole[9000:], more=False))
    got = raw.wait(lambda got: frames.count(frames.DISPOSITION)(got) >= 1, "link 0's outcome")
    assert held() == [0]
    raw.close()
    detached = frames.errors(got, frames.DETACH)
    assert len(detached) == 1, got
    assert detached[0][0] == "amqp:resource-limit-exceeded"
    assert "more than max-message-size 10000" in detached[0][1]
    assert frames.errors(got, frames.CLOSE) == []
    (outcome,) = [p for p in got if p.descriptor == frames.DISPOSITION]
    assert outcome.value[4].descriptor == 0x24  # accepted
    round_trip(broker.url)
