"""SIGKILL of `scow run` on the database store in the middle of a large message's life:
after a restart no row of LARGE_MESSAGES is left that no message refers to, and no
accepted message is lost (on SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from proton import Message

from scow.core.testing import free_port, wait_for
from scow.protocols.amqp import engine
from tests.database.test_database_large_messages import stored_bodies
from tests.durability.test_large_message_crash import PLUGINS, RawClient, body_of, send_half
from tests.stomp.stomp_helpers import RawStomp
from tests.wire.helpers import connected, consume_all, receive, send

SECTIONS = {"amqp": {"min-large-message-size": 64 << 10}}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def journal(request: pytest.FixtureRequest) -> str:
    """The database the brokers of these tests keep their journal (and bodies) in."""
    return str(request.param)


@pytest.fixture
def database(journal: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The URL of the test's database (the one `scow_broker_process` gives the broker)."""
    if journal == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return f"sqlite:///{tmp_path / 'data' / 'scow.db'}"


def test_sigkill_mid_arrival_leaves_no_rows_and_no_message(
    scow_broker_process: Any, database: str
) -> None:
    broker = scow_broker_process(plugins=PLUGINS, sections=SECTIONS)
    client = send_half(broker.port, "half")
    # written as the frames arrive: rows of the unfinished message are in the database
    wait_for(
        lambda: sum(stored_bodies(database).values()) >= 3, 10, what="the partial message's rows"
    )
    broker.kill()
    client.close()
    restarted = scow_broker_process(plugins=PLUGINS, sections=SECTIONS, port=broker.port)
    assert stored_bodies(database) == {}  # removed at startup: the message never completed
    assert consume_all(restarted.url, "half", quiet=0.5) == []


def test_sigkill_mid_delivery_keeps_the_message_whole(
    scow_broker_process: Any, database: str
) -> None:
    broker = scow_broker_process(plugins=PLUGINS, sections=SECTIONS)
    body = body_of(16 << 20, seed=2)
    with connected(broker.url) as conn:
        send(conn, "streamed", Message(body=body, durable=True))
    client = RawClient(broker.port)
    engine.new_receiver(client.session, "slow", "streamed", 1)
    # read 2 MiB of the 16 and stop reading: the broker is mid-stream, held by the socket
    client.until(lambda: client.received > 2 << 20, "part of the message")
    broker.kill()
    client.close()
    restarted = scow_broker_process(plugins=PLUGINS, sections=SECTIONS, port=broker.port)
    assert list(stored_bodies(database).values()) == [17]
    with connected(restarted.url) as conn:
        (got,) = receive(conn.create_receiver("streamed", credit=1), 1)
    assert got.body == body
    wait_for(lambda: not stored_bodies(database), 5, what="the rows to go with the ack")


def test_accepted_large_messages_survive_a_sigkill(scow_broker_process: Any, database: str) -> None:
    broker = scow_broker_process(plugins=PLUGINS, sections=SECTIONS)
    bodies = [body_of((1 << 20) + i * 4099, seed=i) for i in range(5)]
    with connected(broker.url) as conn:
        send(conn, "kept", *(Message(body=b, durable=True) for b in bodies))  # all accepted
    broker.kill()
    restarted = scow_broker_process(plugins=PLUGINS, sections=SECTIONS, port=broker.port)
    assert [bytes(m.body) for m in consume_all(restarted.url, "kept", quiet=0.5)] == bodies
    wait_for(lambda: not stored_bodies(database), 5, what="the rows to go with the acks")


def test_sigkill_mid_stomp_text_send_leaves_no_rows_and_keeps_the_receipted_one(
    scow_broker_process: Any, database: str
) -> None:
    """A STOMP SEND without content-length streams to rows; its size is written over its
    first row once its NUL has come (after that row went in)."""
    stomp_port = free_port()
    stomp = {
        "listen": [f"127.0.0.1:{stomp_port}"],
        "anycast-prefix": "/queue/",
        "min-large-message-size": 64 << 10,
    }
    kwargs = {"plugins": [*PLUGINS, "stomp"], "sections": {**SECTIONS, "stomp": stomp}}
    broker = scow_broker_process(**kwargs)
    client = RawStomp(stomp_port)
    head = b"SEND\ndestination:/queue/text\npersistent:true\nreceipt:%s\n\n"
    whole = "é" * (3 << 19)  # 3 MiB of UTF-8 text
    client.send(head % b"r" + whole.encode() + b"\x00")
    assert client.read_frame()[:2] == ("RECEIPT", {"receipt-id": "r"})
    client.send(head % b"never" + b"n" * (3 << 20))  # its NUL never comes
    wait_for(lambda: len(stored_bodies(database)) == 2, 10, what="the partial SEND's rows")
    broker.kill()
    client.close()
    restarted = scow_broker_process(**kwargs, port=broker.port)
    assert len(stored_bodies(database)) == 1  # the partial SEND's rows removed at startup
    assert [m.body for m in consume_all(restarted.url, "text", quiet=0.5)] == [whole]
    wait_for(lambda: not stored_bodies(database), 5, what="the rows to go")
