"""SIGKILL of `scow run` on the database store in the middle of a large message's life:
after a restart no row of LARGE_MESSAGES is left that no message refers to, and no
accepted message is lost (on SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from proton import Message

from scow.core.testing import wait_for
from scow.protocols.amqp import engine
from tests.database.test_database_large_messages import stored_bodies
from tests.durability.test_large_message_crash import PLUGINS, RawClient, body_of, send_half
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
