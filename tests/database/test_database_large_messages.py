"""Large messages on the database store: their bodies are rows of the LARGE_MESSAGES table
(no file under the data dir), one body per message however many queues it reaches, gone
with the last reference; `scow data export`/`import` carry them between files and a
database. Crashes: tests/durability/test_database_large_message_crash.py."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from proton import Delivery, Message
from proton.utils import LinkDetached

from scow.core import cli
from scow.core.management import Management
from scow.core.testing import BrokerThread, broker_config, wait_for, write_config
from scow.plugins.database_store import large_messages as db_large
from scow.protocols.amqp import engine
from tests.database.backends import REFUSED, on_database, refuse_rows
from tests.wire.helpers import Capabilities, RawClient, connected, receive, send
from tests.wire.test_large_messages import send_in_transaction

LARGE = 16 << 10
PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]
SECTIONS = {"amqp": {"min-large-message-size": LARGE}}


def body_of(size: int, seed: int = 0) -> bytes:
    return bytes((i * 11 + seed) & 0xFF for i in range(256)) * (size // 256) + b"z" * (size % 256)


def stored_bodies(url: str) -> dict[int, int]:
    """Rows of the LARGE_MESSAGES table per body id, read with a client of our own."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text('SELECT id, count(*) FROM "LARGE_MESSAGES" GROUP BY id')
            ).all()
    finally:
        engine.dispose()
    return {int(i): int(n) for i, n in rows}


def large_files(data_dir: Path) -> list[Path]:
    directory = data_dir / "large-messages"
    return sorted(directory.iterdir()) if directory.is_dir() else []


def on_db(database_url: str, **sections: Any) -> dict[str, Any]:
    return on_database({"plugins": PLUGINS, "sections": {**SECTIONS, **sections}}, database_url)


def test_a_large_message_body_is_rows_of_the_database_and_comes_back_whole(
    scow_broker: Any, database_url: str, tmp_path: Path
) -> None:
    broker = scow_broker(**on_db(database_url))
    body = body_of(3 << 20 | 12345)  # over three rows, the last one short
    with connected(broker.url) as conn:
        send(conn, "big", Message(body=body, durable=True, subject="s", properties={"k": 1}))
        (rows,) = stored_bodies(database_url).values()
        assert rows == 4
        assert not large_files(tmp_path / "data-0")
        figures = broker.call(broker.broker.stats)["large-messages"]
        assert figures["files"] == 1 and figures["bytes"] > len(body)
        assert broker.call(lambda: broker.broker.addresses["big"].size) < 4096
        (got,) = receive(conn.create_receiver("big", credit=1), 1)
    assert got.body == body and got.subject == "s" and got.properties == {"k": 1}
    wait_for(lambda: not stored_bodies(database_url), 5, what="the rows to go with the ack")


def test_one_body_for_every_queue_a_multicast_message_reaches(
    scow_broker: Any, database_url: str
) -> None:
    broker = scow_broker(**on_db(database_url))
    body = body_of(1 << 20 | 7)
    with connected(broker.url) as conn:
        first = conn.create_receiver("news", name="a", options=Capabilities("topic"), credit=0)
        second = conn.create_receiver("news", name="b", options=Capabilities("topic"), credit=0)
        conn.create_sender("news", options=Capabilities("topic")).send(
            Message(body=body, durable=True)
        )
        assert len(stored_bodies(database_url)) == 1
        first.flow(1)
        assert receive(first, 1)[0].body == body
        assert len(stored_bodies(database_url)) == 1  # the other subscription holds it
        second.flow(1)
        assert receive(second, 1)[0].body == body
    wait_for(lambda: not stored_bodies(database_url), 5, what="the rows to go with the last ack")


def test_a_rejected_large_message_moves_to_the_dead_letter_address_with_its_body(
    scow_broker: Any, database_url: str
) -> None:
    broker = scow_broker(**on_db(database_url))
    body = body_of(2 << 20, seed=5)
    with connected(broker.url) as conn:
        send(conn, "doomed", Message(body=body, durable=True))
        receiver = conn.create_receiver("doomed", credit=1)
        receiver.receive(timeout=10)
        receiver.reject()
        (dead,) = receive(conn.create_receiver("DLA", credit=1), 1)
        assert len(stored_bodies(database_url)) == 1  # moved, not copied
    assert dead.body == body
    wait_for(lambda: not stored_bodies(database_url), 5, what="the rows to go")


def test_large_messages_stream_through_while_the_store_writes_behind(
    scow_broker: Any, database_url: str
) -> None:
    # more than BEHIND bytes in one message: the producer's socket waits for the store
    broker = scow_broker(**on_db(database_url))
    bodies = [body_of(db_large.BEHIND * 2 + 999, seed=i) for i in range(2)]
    with connected(broker.url) as conn:
        receiver = conn.create_receiver("flow", credit=2)
        send(conn, "flow", *(Message(body=b, durable=True) for b in bodies))
        got = receive(receiver, 2)
    assert [m.body for m in got] == bodies
    wait_for(lambda: not stored_bodies(database_url), 5, what="the rows to go")


def test_a_purged_queue_deletes_its_large_messages_bodies(
    scow_broker: Any, database_url: str
) -> None:
    broker = scow_broker(**on_db(database_url))
    with connected(broker.url) as conn:
        send(conn, "purged", *(Message(body=body_of(LARGE * 4, seed=i)) for i in range(3)))
    assert len(stored_bodies(database_url)) == 3
    assert broker.call(lambda: Management(broker.broker).purge_queue("purged")) == 3
    wait_for(lambda: not stored_bodies(database_url), 5, what="the rows to go with the purge")


def _config(tmp_path: Path, name: str, database_url: str | None) -> Path:
    kwargs: dict[str, Any] = {"plugins": PLUGINS, "sections": SECTIONS}
    if database_url is not None:
        kwargs = on_database(kwargs, database_url)
    return write_config(tmp_path / f"{name}.toml", broker_config(tmp_path / name, **kwargs))


def test_export_and_import_carry_large_messages_between_files_and_a_database(
    tmp_path: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bodies = [body_of(2 << 20 | i, seed=i) for i in range(3)]
    files = BrokerThread(_config(tmp_path, "files", None)).start()
    try:
        with connected(files.url) as conn:
            send(conn, "kept", *(Message(body=b, durable=True, subject="k") for b in bodies))
    finally:
        files.stop()
    exported = tmp_path / "files.jsonl"
    data = ["--data-dir", str(tmp_path / "files")]
    assert cli.main(["data", "export", *data, "--output", str(exported)]) == 0
    db_config = _config(tmp_path, "db", database_url)
    assert cli.main(["data", "import", "--config", str(db_config), "--input", str(exported)]) == 0
    assert len(stored_bodies(database_url)) == 3
    assert not large_files(tmp_path / "db")
    again = tmp_path / "db.jsonl"
    assert cli.main(["data", "export", "--config", str(db_config), "--output", str(again)]) == 0
    assert "'messages': 3" in capsys.readouterr().out
    back = ["--data-dir", str(tmp_path / "back")]
    assert cli.main(["data", "import", *back, "--input", str(again)]) == 0
    assert len(large_files(tmp_path / "back")) == 3

    on_db = BrokerThread(db_config).start()
    try:
        with connected(on_db.url) as conn:
            got = receive(conn.create_receiver("kept", credit=3), 3)
        assert [(m.body, m.subject) for m in got] == [(b, "k") for b in bodies]
        wait_for(lambda: not stored_bodies(database_url), 5, what="the rows to go")
    finally:
        on_db.stop()
    back_config = write_config(
        tmp_path / "back.toml",
        broker_config(tmp_path / "back", plugins=PLUGINS, sections=SECTIONS),
    )
    on_files = BrokerThread(back_config).start()
    try:
        with connected(on_files.url) as conn:
            got = receive(conn.create_receiver("kept", credit=3), 3)
        assert [m.body for m in got] == bodies
    finally:
        on_files.stop()


def _answer(conn: Any, address: str, message: Message) -> Any:
    """The broker's answer to one message: the condition of its rejection, or of its
    link's detach when it was refused while it arrived."""
    sender = conn.create_sender(address)
    delivery = sender.link.send(message)
    try:
        conn.wait(lambda: delivery.remote_state, msg="the broker's answer", timeout=30)
    except LinkDetached as exc:
        return exc.link.remote_condition
    assert delivery.remote_state == Delivery.REJECTED, delivery.remote_state
    return delivery.remote.condition


def test_a_body_the_database_refuses_is_refused_to_its_producer_and_its_rows_go(
    scow_broker: Any, database_url: str
) -> None:
    broker = scow_broker(**on_db(database_url))
    refuse_rows(database_url)  # from a body's third row on, as if the table went read-only
    with connected(broker.url) as conn:
        condition = _answer(conn, "big", Message(body=body_of(5 << 20), durable=True))
    assert condition.name == "amqp:resource-limit-exceeded"
    assert REFUSED in condition.description and "LARGE_MESSAGES" in condition.description
    wait_for(lambda: not stored_bodies(database_url), 10, what="the partial rows to go")
    stats = broker.call(broker.broker.stats)["large-messages"]
    assert stats == {"files": 0, "bytes": 0, "arriving": 0}
    assert (broker.queue_stats("big") or {}).get("message-count", 0) == 0
    # the broker serves others, large messages that fit in two rows too
    fits = body_of(3 << 19)
    with connected(broker.url) as conn:
        send(conn, "big", Message(body=b"small", durable=True), Message(body=fits, durable=True))
        got = receive(conn.create_receiver("big", credit=2), 2)
    assert [bytes(m.body) for m in got] == [b"small", fits]


@pytest.mark.postgres
def test_a_large_message_waiting_for_a_locked_table_holds_only_its_own_link(
    scow_broker: Any, postgres_url: str
) -> None:
    """Two links on one session of one connection: while one link's large message waits
    for LARGE_MESSAGES (locked by another client), the other's messages are answered, and
    so are other connections'; the large one is accepted once the table is free."""
    broker = scow_broker(**on_db(postgres_url))
    body = body_of(2 << 20 | 3)
    client = RawClient(broker.port)
    large = engine.new_sender(client.session, "large", "big")
    small = engine.new_sender(client.session, "small", "small")
    client.until(lambda: engine.link_credit(large) and engine.link_credit(small), "credit")
    locker = sa.create_engine(postgres_url).connect()
    try:
        locker.exec_driver_sql('LOCK TABLE "LARGE_MESSAGES" IN EXCLUSIVE MODE')
        waiting = engine.send(large, b"L", bytes(Message(body=body, durable=True).encode()))
        client.until(
            lambda: broker.call(broker.broker.stats)["large-messages"]["files"] == 1,
            "the large message whole, waiting for its rows",
        )
        answered = [
            engine.send(small, b"s%d" % n, bytes(Message(body=f"s{n}", durable=True).encode()))
            for n in range(3)
        ]
        client.until(
            lambda: all(engine.delivery_remote_state(d) == engine.ACCEPTED for d in answered),
            "the other link's messages accepted",
        )
        with connected(broker.url) as other:  # and other connections
            send(other, "small", Message(body="other", durable=True))
        assert not engine.delivery_remote_state(waiting)  # still waiting for its rows
    finally:
        locker.rollback()
        locker.close()
    client.until(
        lambda: engine.delivery_remote_state(waiting) == engine.ACCEPTED, "the large one accepted"
    )
    client.close()
    with connected(broker.url) as conn:
        (got,) = receive(conn.create_receiver("big", credit=1), 1)
        smalls = receive(conn.create_receiver("small", credit=4), 4)
    assert bytes(got.body) == body
    assert [m.body for m in smalls] == ["s0", "s1", "s2", "other"]


def test_a_transaction_commits_its_large_messages_once_their_rows_are_stored(
    scow_broker: Any, database_url: str
) -> None:
    """The discharge comes right after the sends: it waits for their rows (the database
    answers after the frames), and commits or rolls back all of them."""
    broker = scow_broker(**on_db(database_url))
    bodies = [body_of(1 << 20 | 9, seed=i) for i in range(2)]
    assert send_in_transaction(broker.url, "txl", bodies, commit=False) == "aborted"
    wait_for(lambda: not stored_bodies(database_url), 10, what="the rolled back rows to go")
    assert send_in_transaction(broker.url, "txl", bodies, commit=True) == "committed"
    assert len(stored_bodies(database_url)) == 2
    with connected(broker.url) as conn:
        got = receive(conn.create_receiver("txl", credit=2), 2)
    assert [bytes(m.body) for m in got] == bodies


def test_large_and_small_messages_sent_at_once_on_one_link_keep_their_order(
    scow_broker: Any, database_url: str
) -> None:
    """The link takes the next large message while the one before waits for its rows'
    sync (on another lane, perhaps answered first); a small one waits behind them."""
    broker = scow_broker(**on_db(database_url))
    bodies = [body_of(1 << 20 | n, seed=n) if n % 3 != 1 else b"small %d" % n for n in range(8)]
    client = RawClient(broker.port)
    link = engine.new_sender(client.session, "order", "order")
    client.until(lambda: engine.link_credit(link) >= len(bodies), "credit")
    sent = [
        engine.send(link, b"%d" % n, bytes(Message(body=body, durable=True).encode()))
        for n, body in enumerate(bodies)
    ]
    client.until(
        lambda: all(engine.delivery_remote_state(d) == engine.ACCEPTED for d in sent),
        "every message accepted",
        timeout=60,
    )
    client.close()
    with connected(broker.url) as conn:
        got = receive(conn.create_receiver("order", credit=len(bodies)), len(bodies))
    assert [bytes(m.body) for m in got] == bodies


def test_a_transactional_message_behind_a_large_one_is_in_the_commit_that_follows_it(
    scow_broker: Any, database_url: str
) -> None:
    """On one link, a large message outside the transaction waits for its rows; the
    transactional message behind it waits in turn, and so does the discharge after it."""
    broker = scow_broker(**on_db(database_url))
    large = body_of(2 << 20 | 1)
    outcome = send_in_transaction(broker.url, "txb", [b"in the tx"], commit=True, before=(large,))
    assert outcome == "committed"
    with connected(broker.url) as conn:
        got = receive(conn.create_receiver("txb", credit=2), 2)
    assert [bytes(m.body) for m in got] == [large, b"in the tx"]


def _exported(tmp_path: Path, bodies: list[bytes]) -> Path:
    """An export of a broker on files holding a small message, then `bodies` as large ones."""
    files = BrokerThread(_config(tmp_path, "source", None)).start()
    try:
        with connected(files.url) as conn:
            send(conn, "kept", Message(body=b"small", durable=True))
            send(conn, "kept", *(Message(body=b, durable=True) for b in bodies))
    finally:
        files.stop()
    exported = tmp_path / "export.jsonl"
    data = ["--data-dir", str(tmp_path / "source")]
    assert cli.main(["data", "export", *data, "--output", str(exported)]) == 0
    return exported


def _cut_short(exported: Path, cut: int) -> tuple[Path, int, int]:
    """A copy of the export whose last large message's data lost its last `cut` bytes
    (its line otherwise whole, the file's end line too); (copy, line number, its id)."""
    lines = exported.read_text().splitlines()
    number = max(n for n, text in enumerate(lines) if '"large":true' in text)
    line = json.loads(lines[number])
    data = base64.b64decode(line["data"])
    line["data"] = base64.b64encode(data[:-cut]).decode()
    lines[number] = json.dumps(line)
    short = exported.with_name("short.jsonl")
    short.write_text("\n".join(lines) + "\n")
    return short, number + 1, line["id"]


def _refuses_cut_short(
    tmp_path: Path, into: list[str], capsys: pytest.CaptureFixture[str], url: str | None = None
) -> None:
    """An import into `into` (CLI arguments) of an export whose large message was cut
    short is refused, naming it and its sizes, and imports nothing (database at `url`)."""
    bodies = [body_of(2 << 20 | 9, seed=1), body_of(1 << 20 | 3, seed=2)]
    exported = _exported(tmp_path, bodies)
    short, number, message_id = _cut_short(exported, 1000)
    capsys.readouterr()
    assert cli.main(["data", "import", *into, "--input", str(short)]) == 2
    error = capsys.readouterr().err
    assert f"line {number}: large message {message_id}: its data holds" in error, error
    assert "its size says" in error and "cut short" in error, error
    found, said = (int(w) for w in re.findall(r"holds (\d+) bytes, its size says (\d+)", error)[0])
    assert said - found == 1000 and 0 < said - len(bodies[1]) < 1000, error  # its sections
    # nothing was written: the whole export imports into the same place afterwards
    assert not large_files(tmp_path / "into")
    if url is not None:
        assert not stored_bodies(url)
    assert cli.main(["data", "import", *into, "--input", str(exported)]) == 0
    assert "'messages': 3" in capsys.readouterr().out


def test_an_import_into_files_refuses_a_large_message_cut_short_and_imports_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _refuses_cut_short(tmp_path, ["--data-dir", str(tmp_path / "into")], capsys)


def test_an_import_into_a_database_refuses_a_large_message_cut_short_and_imports_nothing(
    tmp_path: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    into = ["--config", str(_config(tmp_path, "into", database_url))]
    _refuses_cut_short(tmp_path, into, capsys, database_url)


def test_an_import_whose_large_message_rows_the_database_refuses_imports_nothing_of_it(
    tmp_path: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    exported = _exported(tmp_path, [body_of(3 << 20 | 5, seed=3)])
    config = _config(tmp_path, "into", database_url)
    cli.main(["data", "print", "--config", str(config)])  # creates the tables
    refuse_rows(database_url)  # its third row is refused, its first two go in
    capsys.readouterr()
    assert cli.main(["data", "import", "--config", str(config), "--input", str(exported)]) == 2
    error = capsys.readouterr().err
    assert re.search(r"line \d+: large message \d+ of \d+ bytes not stored", error), error
    assert REFUSED in error, error
    assert not stored_bodies(database_url)  # the rows it had go with it
