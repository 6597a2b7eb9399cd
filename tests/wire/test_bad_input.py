"""Hostile and broken peers: raw bytes, bad frames, bad credentials; the coordinator link.

Each raw-socket test checks what the broker answers and that it then still serves a
normal client.
"""

from __future__ import annotations

import struct

import pytest
from proton import ConnectionException, Message
from proton.handlers import TransactionalClientHandler

from scow.core.testing import wait_for
from tests.security.helpers import users_file

from .helpers import (
    AMQP_HEADER,
    SASL_HEADER,
    close_condition,
    connected,
    exchange,
    frame,
    round_trip,
    run_container,
    send,
)


def open_connections(broker) -> int:
    server = broker.server.protocols["amqp"]
    return broker.call(lambda: len(server.connections))


def test_garbage_bytes_get_the_protocol_header_and_a_closed_socket(scow_broker):
    broker = scow_broker()
    reply = exchange(broker.port, b"\x16\x03\x01\x02\x00garbage that is not AMQP")
    assert reply == AMQP_HEADER  # the header the broker speaks, then close (spec 2.2)
    wait_for(lambda: open_connections(broker) == 0, what="the connection to be dropped")
    round_trip(broker.url)


def test_wrong_protocol_header_gets_the_amqp_header_and_a_closed_socket(scow_broker):
    broker = scow_broker()
    reply = exchange(broker.port, b"HTTP/1.1 200 OK\r\n\r\n")
    assert reply == AMQP_HEADER
    round_trip(broker.url)


def test_unsupported_amqp_version_gets_the_supported_header(scow_broker):
    broker = scow_broker()
    reply = exchange(broker.port, b"AMQP\x00\x00\x09\x01")  # AMQP 0-9-1
    assert reply == AMQP_HEADER
    round_trip(broker.url)


def test_plain_amqp_header_gets_the_sasl_header_when_anonymous_is_off(scow_broker, tmp_path):
    users = users_file(tmp_path / "users.toml", {"a": ("b", [])})
    broker = scow_broker(
        sections={"security": {"allow-anonymous": False, "users-file": str(users)}}
    )
    reply = exchange(broker.port, AMQP_HEADER)  # skipping SASL is not allowed
    assert reply == SASL_HEADER
    round_trip(broker.url, user="a", password="b", allowed_mechs="PLAIN")


def test_truncated_frame_then_close_leaves_the_broker_serving(scow_broker):
    broker = scow_broker()
    half_open = frame(b"\x00\x53\x10\xc0\x0c\x04\xa1\x04test")[:9]  # header says more follows
    exchange(broker.port, AMQP_HEADER + half_open, close=True)
    wait_for(lambda: open_connections(broker) == 0, what="the broker to drop the connection")
    round_trip(broker.url)


def test_frame_larger_than_max_frame_size_closes_with_framing_error(scow_broker):
    broker = scow_broker(sections={"amqp": {"max-frame-size": 512}})
    oversized = struct.pack(">IBBH", 4096, 2, 0, 0) + bytes(4096 - 8)
    reply = exchange(broker.port, AMQP_HEADER + oversized)
    condition, _description = close_condition(reply)
    assert condition == "amqp:connection:framing-error"
    round_trip(broker.url)


def test_frame_with_a_size_smaller_than_its_header_closes_with_framing_error(scow_broker):
    broker = scow_broker()
    reply = exchange(broker.port, AMQP_HEADER + struct.pack(">IBBH", 4, 2, 0, 0))
    condition, _description = close_condition(reply)
    assert condition == "amqp:connection:framing-error"
    round_trip(broker.url)


def test_malformed_performative_closes_with_decode_error(scow_broker):
    broker = scow_broker()
    garbage = frame(b"\x00\x53\x10" + b"\xde\xad\xbe\xef" * 3)  # an `open` whose body is junk
    reply = exchange(broker.port, AMQP_HEADER + garbage, timeout=2)
    condition, _description = close_condition(reply)
    assert condition == "amqp:decode-error"


def test_malformed_performative_leaves_the_broker_serving(scow_broker):
    broker = scow_broker()
    garbage = frame(b"\xde\xad\xbe\xef" * 3)
    exchange(broker.port, AMQP_HEADER + garbage, close=True)
    wait_for(lambda: open_connections(broker) == 0, what="the broker to drop the connection")
    round_trip(broker.url)


# --------------------------------------------------------------------------- SASL


def secure(tmp_path) -> dict:
    users = users_file(tmp_path / "users.toml", {"alice": ("secret", [])})
    return {
        "security": {
            "users-file": str(users),
            "allow-anonymous": False,
            "login-failure-delay": 0,
        }
    }


def test_sasl_plain_with_a_configured_user_can_send_and_receive(scow_broker, tmp_path):
    broker = scow_broker(sections=secure(tmp_path))
    round_trip(broker.url, user="alice", password="secret", allowed_mechs="PLAIN")
    # the broker knows who is connected
    with connected(broker.url, user="alice", password="secret", allowed_mechs="PLAIN"):
        server = broker.server.protocols["amqp"]
        users = broker.call(lambda: [c.info.user for c in server.connections])
        assert users == ["alice"]


@pytest.mark.parametrize(
    ("user", "password"), [("alice", "wrong"), ("mallory", "secret")], ids=["password", "user"]
)
def test_sasl_plain_with_bad_credentials_is_refused(scow_broker, user, password, tmp_path):
    broker = scow_broker(sections=secure(tmp_path))
    with (
        pytest.raises(ConnectionException) as refused,
        connected(broker.url, user=user, password=password, allowed_mechs="PLAIN"),
    ):
        pass
    assert "amqp:unauthorized-access" in str(refused.value)
    round_trip(broker.url, user="alice", password="secret", allowed_mechs="PLAIN")


def test_anonymous_client_is_refused_when_anonymous_is_off(scow_broker, tmp_path):
    broker = scow_broker(sections=secure(tmp_path))
    with (
        pytest.raises(ConnectionException) as refused,
        connected(broker.url, allowed_mechs="ANONYMOUS"),
    ):
        pass
    assert "amqp:unauthorized-access" in str(refused.value)


# --------------------------------------------------------------------------- transactions


class _TransactionalSend(TransactionalClientHandler):
    """Declare, send one message in the transaction, look at the queue, commit."""

    def __init__(self, url: str, peek) -> None:
        super().__init__()
        self.url = url
        self.peek = peek  # the queue's message count, read on the broker
        self.steps: list[str] = []
        self.before_commit: int | None = None
        self.after_commit: int | None = None
        self.condition = None
        self.done = False

    def on_start(self, event):
        self.conn = event.container.connect(self.url, reconnect=False)
        self.sender = event.container.create_sender(self.conn, "txq")
        self.txn = None
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event):
        self.steps.append("declared")
        self.txn = event.transaction
        self.txn.send(self.sender, Message(body="in a transaction"))

    def on_settled(self, event):
        if event.link.name == self.sender.name and "sent" not in self.steps:
            self.steps.append("sent")
            self.before_commit = self.peek()
            self.txn.commit()

    def on_transaction_committed(self, event):
        self.steps.append("committed")
        self.after_commit = self.peek()
        self.conn.close()

    def on_transaction_declare_failed(self, event):
        self._fail(event, "declare-failed")

    def on_transaction_commit_failed(self, event):
        self._fail(event, "commit-failed")

    def on_link_error(self, event):
        self._fail(event, "link-error")

    def _fail(self, event, step):
        self.steps.append(step)
        self.condition = (event.link or event.delivery.link).remote_condition
        self.conn.close()

    def on_connection_closed(self, event):
        self.done = True

    def on_transport_closed(self, event):
        self.done = True


def test_transactional_send_is_routed_only_at_commit(scow_broker):
    broker = scow_broker()

    def peek() -> int:
        stats = broker.queue_stats("txq")
        return stats["message-count"] if stats else 0

    handler = _TransactionalSend(broker.url, peek)
    run_container(handler, lambda: handler.done, timeout=15)
    assert handler.steps == ["declared", "sent", "committed"], handler.condition
    assert (handler.before_commit, handler.after_commit) == (0, 1)
    with connected(broker.url) as conn:
        assert conn.create_receiver("txq").receive(timeout=10).body == "in a transaction"


def test_silent_peer_is_closed_after_the_idle_timeout(scow_broker):
    from scow.protocols.amqp.codec import Described, encode_value

    broker = scow_broker(sections={"amqp": {"idle-timeout": 400}})
    open_frame = frame(encode_value(Described(0x10, ["silent-client"])))
    reply = exchange(broker.port, AMQP_HEADER + open_frame, timeout=5)  # then says nothing
    assert close_condition(reply)[0] == "amqp:resource-limit-exceeded"
    round_trip(broker.url)


def test_oversize_message_closes_its_link_and_the_connection_serves_on(scow_broker):
    from proton.utils import LinkDetached

    broker = scow_broker(sections={"amqp": {"max-message-size": 10_000, "max-frame-size": 4096}})
    with connected(broker.url) as conn:
        sender = conn.create_sender("big")
        with pytest.raises((LinkDetached, ConnectionException)) as refused:
            sender.send(Message(body=b"x" * 50_000), timeout=10)
        assert "amqp:link:message-size-exceeded" in str(refused.value)
        assert "max-message-size 10000" in str(refused.value)
        conn.create_sender("big", name="again").send(Message(body="small"), timeout=10)
    assert broker.queue_stats("big")["message-count"] == 1


def test_a_peer_whose_input_the_broker_holds_is_not_closed_as_idle(scow_broker):
    """While a large message's store is behind, the broker stops reading the producer's
    socket (`hold_input`), and the peer's heartbeats wait unread in the network. That
    silence is the broker's own doing: found in a database outage, where a producer's
    connection was closed with "local-idle-timeout expired" while its input was held.
    Meanwhile the peer must hear the broker's heartbeats, or it gives up on the broker."""
    from proton import Timeout

    broker = scow_broker(sections={"amqp": {"idle-timeout": 400}})
    with connected(broker.url, heartbeat=0.4) as conn:
        send(conn, "held", Message(body="before"))
        holder = object()
        (amqp,) = [c for c in broker.server.protocols["amqp"].connections]
        broker.call(lambda: amqp.hold_input(holder))
        with pytest.raises(Timeout):  # 5 idle-timeouts, both ways: the connection lives
            conn.wait(lambda: False, timeout=2.0)
        broker.call(lambda: amqp.release_input(holder))
        send(conn, "held", Message(body="after"))
    assert broker.queue_stats("held")["message-count"] == 2
