"""STOMP bodies over min-large-message-size take the large message path: a file of their
own, read back for STOMP and streamed to AMQP consumers."""

from __future__ import annotations

from proton import Message
from stomp_helpers import client, start

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
