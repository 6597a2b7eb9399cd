"""A large message whose body PostgreSQL cannot take, because the server went away while
its rows were written or at their final sync: the producer is refused once the store
gives up (`jdbc-network-timeout`), never left waiting; the rows go once the database is
back, accepted messages stay, and the broker serves everyone else."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from proton import Message

from scow.core.testing import wait_for
from scow.protocols.amqp import engine
from tests.database.backends import on_database
from tests.database.postgres import PASSWORD, USER, PostgresServer
from tests.database.test_database_large_messages import PLUGINS, SECTIONS, body_of, stored_bodies
from tests.wire.helpers import RawClient, connected, receive, send

#: The store gives up on a lost database after this long (ms): refusals come quickly.
GIVE_UP = 1_000

pytestmark = pytest.mark.postgres


def _start(scow_broker: Any, url: str) -> Any:
    kwargs = on_database({"plugins": PLUGINS, "sections": SECTIONS}, url)
    kwargs["sections"]["database"]["jdbc-network-timeout"] = GIVE_UP
    return scow_broker(**kwargs)


def _psycopg(server: PostgresServer, url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host="127.0.0.1",
        port=server.port,
        user=USER,
        password=PASSWORD,
        dbname=url.rsplit("/", 1)[1],
    )


@contextlib.contextmanager
def lock_row_held(server: PostgresServer, url: str) -> Iterator[None]:
    """Hold the broker's lock row in a transaction of our own: every fenced commit (the
    syncer's included) waits behind it, until the server goes."""
    conn = _psycopg(server, url)
    conn.execute('SELECT * FROM "NODE_MANAGER_STORE" FOR UPDATE')
    try:
        yield
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.close()


def _new_sender(client: RawClient, address: str) -> Any:
    link = engine.new_sender(client.session, address, address)
    client.until(lambda: engine.link_credit(link) > 0, "credit")
    return link


def _refusal(client: RawClient, link: Any, delivery: Any) -> tuple[str | None, str | None]:
    """The broker's refusal of `delivery`: its rejection's condition, or its link's."""
    client.until(
        lambda: engine.delivery_remote_state(delivery) or engine.remote_closed(link),
        "the broker's answer",
        timeout=30,
    )
    if engine.delivery_remote_state(delivery) == engine.REJECTED:
        return engine.rejection(delivery)
    assert not engine.delivery_remote_state(delivery), "the message was not refused"
    return engine.remote_link_condition(link)


def _rows_gone_and_others_served(broker: Any, url: str) -> None:
    wait_for(lambda: not stored_bodies(url), 30, what="the refused message's rows to go")
    assert broker.call(broker.broker.stats)["large-messages"] == {
        "files": 0,
        "bytes": 0,
        "arriving": 0,
    }
    fits = body_of(3 << 20 | 17, seed=3)
    with connected(broker.url) as conn:
        send(conn, "others", Message(body=b"small", durable=True), Message(body=fits, durable=True))
        got = receive(conn.create_receiver("others", credit=2), 2)
        (kept,) = receive(conn.create_receiver("kept", credit=1), 1)
    assert [bytes(m.body) for m in got] == [b"small", fits]
    assert kept.body == "accepted before"


def test_a_large_message_whose_final_sync_fails_is_refused_and_its_rows_go(
    private_postgres: PostgresServer, scow_broker: Any
) -> None:  # in that order: the broker stops before its database
    server = private_postgres
    url = server.url(server.create_database())
    broker = _start(scow_broker, url)
    with connected(broker.url) as conn:
        send(conn, "kept", Message(body="accepted before", durable=True))
    client = RawClient(broker.port)
    link = _new_sender(client, "big")
    with lock_row_held(server, url):
        delivery = engine.send(
            link, b"1", bytes(Message(body=body_of(2 << 20 | 5), durable=True).encode())
        )
        # every row is in; the final sync cannot commit while we hold the lock row
        client.until(lambda: list(stored_bodies(url).values()) == [3], "every row written")
        server.stop("immediate")  # and now never will: the server is gone
    started = time.monotonic()
    name, description = _refusal(client, link, delivery)
    assert name == "amqp:resource-limit-exceeded"
    assert description is not None and "LARGE_MESSAGES" in description, description
    assert "could not be synced" in description, description
    assert time.monotonic() - started < 20, "refused long after the store gave up"
    client.close()
    server.start()
    _rows_gone_and_others_served(broker, url)


def test_postgresql_stopped_in_the_middle_of_a_large_message_refuses_it_then_cleans_up(
    private_postgres: PostgresServer, scow_broker: Any
) -> None:
    server = private_postgres
    url = server.url(server.create_database())
    broker = _start(scow_broker, url)
    with connected(broker.url) as conn:
        send(conn, "kept", Message(body="accepted before", durable=True))
    encoded = bytes(Message(body=body_of(6 << 20, seed=1), durable=True).encode())
    client = RawClient(broker.port)
    link = _new_sender(client, "big")
    delivery = engine.begin_send(link, b"1", encoded[: 2 << 20])
    client.until(lambda: stored_bodies(url), "the first rows")
    server.stop("fast")
    engine.send_more(link, encoded[2 << 20 :])
    engine.link_advance(link)
    name, description = _refusal(client, link, delivery)
    assert name == "amqp:resource-limit-exceeded"
    assert description is not None and "LARGE_MESSAGES" in description, description
    assert "connection" in description.lower(), description  # the driver's own words
    client.close()
    assert (broker.queue_stats("big") or {}).get("message-count", 0) == 0
    server.start()
    _rows_gone_and_others_served(broker, url)
