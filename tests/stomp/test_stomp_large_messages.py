"""STOMP bodies over min-large-message-size take the large message path: a SEND's body
goes to a file of its own as it arrives, and a large message (whoever sent it) goes to a
STOMP subscriber from its file as the socket takes it. Crashes: tests/durability/
test_large_message_crash.py."""

from __future__ import annotations

import pytest
from proton import Message
from stomp_helpers import RawStomp, client, start

from scow.core.testing import wait_for
from tests.wire.helpers import connected, receive, send

LARGE = 64 << 10


def _files(broker) -> list:
    directory = broker.broker.large_messages.directory
    return list(directory.iterdir()) if directory.is_dir() else []


def test_a_large_stomp_send_is_kept_in_a_file_and_reaches_amqp_whole(scow_broker):
    broker = start(scow_broker, sections={"stomp": {"min-large-message-size": LARGE}})
    body = bytes(range(256)) * 1024  # 256 KiB
    with client(broker) as (conn, seen):
        conn.send("/queue/bulk", body, headers={"persistent": "true", "k": "v"}, receipt="r")
        seen.wait_receipt("r")
    assert len(_files(broker)) == 1
    assert broker.call(lambda: broker.broker.addresses["bulk"].size) < 4096
    with connected(broker.url) as amqp:
        (message,) = receive(amqp.create_receiver("bulk", credit=1), 1)
    assert bytes(message.body) == body and message.properties == {"k": "v"}
    wait_for(lambda: not _files(broker), 5, what="the file to go")


def test_a_large_amqp_message_reaches_a_stomp_subscriber_whole(scow_broker):
    broker = start(scow_broker, sections={"amqp": {"min-large-message-size": LARGE}})
    body = bytes(range(256)) * 1024
    with connected(broker.url) as amqp:
        send(amqp, "out", Message(body=body, durable=True, properties={"n": 1}))
    assert len(_files(broker)) == 1
    with client(broker) as (conn, seen):
        conn.subscribe("/queue/out", id="s")
        (frame,) = seen.wait_messages(1)
    assert frame.body == body and frame.headers["n"] == "1"
    wait_for(lambda: not _files(broker), 5, what="the file to go")


def _stats(broker) -> dict:
    return broker.call(broker.broker.stats)["large-messages"]


def _stomp_connections(broker) -> list:
    return list(broker.server.protocols["stomp"].connections)


def test_a_large_send_is_in_its_file_before_its_last_byte_arrives(scow_broker):
    broker = start(scow_broker, sections={"stomp": {"min-large-message-size": LARGE}})
    body = bytes(range(256)) * (16 << 10)  # 4 MiB, NUL bytes and all
    raw = RawStomp(broker.port_of("stomp"))
    raw.send(
        b"SEND\ndestination:/queue/in\npersistent:true\nreceipt:r\n"
        b"content-length:%d\n\n" % len(body) + body[: 3 << 20]
    )
    # three quarters of the body are on disk while the frame is still arriving
    wait_for(lambda: _files(broker) and _files(broker)[0].stat().st_size > 3 << 20, 10)
    assert _stats(broker)["arriving"] == 1
    raw.send(body[3 << 20 :] + b"\x00")
    assert raw.read_frame()[:2] == ("RECEIPT", {"receipt-id": "r"})
    raw.close()
    assert _stats(broker)["arriving"] == 0 and len(_files(broker)) == 1
    with connected(broker.url) as amqp:
        (message,) = receive(amqp.create_receiver("in", credit=1), 1)
    assert bytes(message.body) == body and message.durable
    wait_for(lambda: not _files(broker), 5, what="the file to go")


def test_a_connection_lost_mid_send_leaves_no_file_and_no_message(scow_broker):
    broker = start(scow_broker, sections={"stomp": {"min-large-message-size": LARGE}})
    raw = RawStomp(broker.port_of("stomp"))
    raw.send(b"SEND\ndestination:/queue/cut\ncontent-length:1000000\n\n" + b"x" * 300_000)
    wait_for(lambda: _stats(broker)["arriving"] == 1, 10, what="the SEND to begin")
    raw.close()
    wait_for(lambda: _stats(broker)["arriving"] == 0, 10, what="the SEND to be abandoned")
    assert _files(broker) == []
    assert (broker.queue_stats("cut") or {}).get("message-count", 0) == 0


def test_a_large_message_reaches_a_slow_subscriber_as_its_socket_takes_it(scow_broker):
    broker = start(scow_broker, sections={"amqp": {"min-large-message-size": LARGE}})
    body = bytes(range(256)) * (128 << 10)  # 32 MiB
    with connected(broker.url) as amqp:
        send(amqp, "slow", Message(body=body, durable=True), Message(body=b"after"))
    raw = RawStomp(broker.port_of("stomp"), receive_buffer=64 << 10)
    raw.send(b"SUBSCRIBE\nid:s\ndestination:/queue/slow\nack:auto\n\n\x00")
    (conn,) = _stomp_connections(broker)
    wait_for(lambda: broker.call(lambda: conn.paused), 10, what="the socket to back up")
    # what waits in the broker is a few chunks of the file, not the message
    assert broker.call(conn.socket.get_write_buffer_size) < 4 << 20
    # a frame asked for meanwhile waits for the MESSAGE, which is not acknowledged yet
    raw.send(b"SEND\ndestination:/queue/other\nreceipt:r\n\nx\x00")
    assert broker.queue_stats("slow")["delivering-count"] == 1
    command, headers, got = raw.read_frame()
    assert (command, headers["content-length"], headers["subscription"]) == (
        "MESSAGE",
        str(len(body)),
        "s",
    )
    assert got == body
    frames = [raw.read_frame() for _ in range(2)]
    assert sorted((c, b) for c, _, b in frames) == [("MESSAGE", b"after"), ("RECEIPT", b"")]
    raw.close()
    wait_for(lambda: (broker.queue_stats("slow") or {}).get("message-count", 0) == 0, 5)
    wait_for(lambda: not _files(broker), 5, what="the file to go with the acknowledgement")


def test_a_subscriber_gone_mid_message_gets_it_back_whole_redelivered(scow_broker):
    broker = start(scow_broker, sections={"stomp": {"min-large-message-size": LARGE}})
    body = bytes(range(256)) * (32 << 10)  # 8 MiB
    with client(broker) as (conn, seen):
        conn.send("/queue/again", body, headers={"persistent": "true"}, receipt="r")
        seen.wait_receipt("r")
    raw = RawStomp(broker.port_of("stomp"), receive_buffer=64 << 10)
    raw.send(b"SUBSCRIBE\nid:s\ndestination:/queue/again\nack:auto\n\n\x00")
    raw.sock.recv(1 << 16)  # the MESSAGE has begun
    raw.close()
    with client(broker) as (conn, seen):
        conn.subscribe("/queue/again", id="s")
        (frame,) = seen.wait_messages(1)
    assert frame.body == body and frame.headers["redelivered"] == "true"
    wait_for(lambda: not _files(broker), 5, what="the file to go")


def test_large_messages_in_client_ack_mode_stream_one_after_another(scow_broker):
    broker = start(scow_broker, sections={"stomp": {"min-large-message-size": LARGE}})
    bodies = [bytes([i]) * (1 << 20) for i in range(3)]
    with client(broker) as (conn, seen):
        for body in bodies:
            conn.send("/queue/many", body, headers={"persistent": "true"})
        conn.subscribe("/queue/many", id="s", ack="client-individual")
        got = seen.wait_messages(3)
        assert [f.body for f in got] == bodies
        assert len(_files(broker)) == 3  # unacknowledged: kept
        for frame in got:
            conn.ack(frame.headers["ack"])
    wait_for(lambda: not _files(broker), 5, what="the files to go with the acks")


@pytest.mark.parametrize(
    ("body", "payload"),
    [
        ("é" * (LARGE // 2 + 1), ("é" * (LARGE // 2 + 1)).encode()),  # a string value
        (list(range(LARGE // 4)), str(list(range(LARGE // 4))).encode()),  # converted whole
    ],
    ids=["string", "list"],
)
def test_a_large_amqp_value_body_reaches_stomp_as_its_text(scow_broker, body, payload):
    broker = start(scow_broker, sections={"amqp": {"min-large-message-size": LARGE}})
    with connected(broker.url) as amqp:
        send(amqp, "text", Message(body=body, durable=True))
    assert len(_files(broker)) == 1
    with client(broker) as (conn, seen):
        conn.subscribe("/queue/text", id="s")
        (frame,) = seen.wait_messages(1)
    assert frame.body == payload
    wait_for(lambda: not _files(broker), 5, what="the file to go")
