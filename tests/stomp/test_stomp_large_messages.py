"""STOMP bodies over min-large-message-size take the large message path: a SEND's body
goes to a file of its own as it arrives, and a large message (whoever sent it) goes to a
STOMP subscriber from its file as the socket takes it. Crashes: tests/durability/
test_large_message_crash.py."""

from __future__ import annotations

import contextlib
import select
import threading
from pathlib import Path

import pytest
from proton import Message
from scow_stomp.frames import MAX_BODY_SIZE
from stomp_helpers import PLUGINS, RawStomp, client, start

from scow.core.testing import wait_for
from tests.conftest import DATABASES
from tests.database.backends import REFUSED, on_database, refuse_rows
from tests.database.test_database_large_message_outages import GIVE_UP, lock_row_held
from tests.database.test_database_large_messages import stored_bodies
from tests.wire.helpers import connected, receive, send
from tests.wire.test_large_messages import files as _bodies

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
    ("body", "payload", "sequence"),
    [
        ("é" * (LARGE // 2 + 1), ("é" * (LARGE // 2 + 1)).encode(), False),  # a string value
        (list(range(LARGE // 4)), str(list(range(LARGE // 4))).encode(), False),  # converted
        (["ab" * 64] * 1024, str(["ab" * 64] * 1024).encode(), True),  # an amqp-sequence
    ],
    ids=["string", "list", "sequence"],
)
def test_a_large_amqp_value_body_reaches_stomp_as_its_text(scow_broker, body, payload, sequence):
    broker = start(scow_broker, sections={"amqp": {"min-large-message-size": LARGE}})
    message = Message(body=body, durable=True)
    message.inferred = sequence
    with connected(broker.url) as amqp:
        send(amqp, "text", message)
    assert len(_files(broker)) == 1
    with client(broker) as (conn, seen):
        conn.subscribe("/queue/text", id="s")
        (frame,) = seen.wait_messages(1)
    assert frame.body == payload
    wait_for(lambda: not _files(broker), 5, what="the file to go")


@pytest.fixture(params=["file", *DATABASES])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the bodies of the tests taking it are: files (""), then rows of
    LARGE_MESSAGES in SQLite and in PostgreSQL (the database's URL)."""
    if request.param == "file":
        return ""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return f"sqlite:///{tmp_path / 'test.db'}"


def _start_on(scow_broker, url: str, stomp: dict) -> object:
    sections = {"stomp": stomp}
    if not url:
        return start(scow_broker, sections=sections)
    kwargs = on_database({"plugins": PLUGINS, "sections": sections}, url)
    return start(scow_broker, **kwargs)


def test_a_large_send_over_max_frame_size_is_bounded_by_max_message_size(scow_broker, store):
    stomp = {
        "min-large-message-size": LARGE,
        "max-frame-size": 16 << 10,
        "max-message-size": 3 << 20,
    }
    broker = _start_on(scow_broker, store, stomp)
    body = bytes(range(256)) * (12 << 10)  # 3 MiB: 192 times max-frame-size
    with client(broker) as (conn, seen):
        conn.send("/queue/big", body, headers={"persistent": "true"}, receipt="r")
        seen.wait_receipt("r")
    with connected(broker.url) as amqp:
        (message,) = receive(amqp.create_receiver("big", credit=1), 1)
    assert bytes(message.body) == body
    # one byte more is refused by its content-length, before any of its body is read
    raw = RawStomp(broker.port_of("stomp"))
    raw.send(b"SEND\ndestination:/queue/big\nreceipt:r\ncontent-length:%d\n\n" % (len(body) + 1))
    command, headers, text = raw.read_frame()
    assert command == "ERROR"
    assert b"exceeds [stomp] max-message-size 3145728" in text, text
    assert "max-message-size" in headers["message"]
    wait_for(lambda: not _bodies(broker), 5, what="no body left")
    # headers still count against max-frame-size
    raw = RawStomp(broker.port_of("stomp"))
    raw.send(b"SEND\ndestination:/queue/big\nh:" + b"v" * (20 << 10) + b"\n\n\x00")
    command, _, text = raw.read_frame()
    assert command == "ERROR" and b"headers of" in text and b"max-frame-size 16384" in text


def test_a_send_without_content_length_goes_to_its_file_as_it_arrives(scow_broker, store):
    # max-frame-size bounds what is held before the body passes min-large-message-size
    stomp = {"min-large-message-size": LARGE, "max-frame-size": 2 * LARGE}
    broker = _start_on(scow_broker, store, stomp)
    text = "".join(chr(0x20 + i % 0x3000) for i in range(2 << 20))  # 1-3 bytes each in UTF-8
    body = text.encode()
    cut = len(body) // 2 + 1  # inside a character: its bytes are split between reads
    raw = RawStomp(broker.port_of("stomp"))
    raw.send(b"SEND\ndestination:/queue/text\npersistent:true\nreceipt:r\n\n" + body[:cut])
    wait_for(lambda: _stats(broker)["arriving"] == 1, 10, what="the body to stream")
    raw.send(body[cut:] + b"\x00")
    assert raw.read_frame()[:2] == ("RECEIPT", {"receipt-id": "r"})
    raw.close()
    assert len(_bodies(broker)) == 1
    assert broker.call(lambda: broker.broker.addresses["text"].size) < 4096
    with client(broker) as (conn, seen):  # as STOMP sends it: the text's bytes
        conn.subscribe("/queue/text", id="s", ack="client-individual")
        (frame,) = seen.wait_messages(1)
        assert frame.body == body
    with connected(broker.url) as amqp:  # as AMQP: a string
        (message,) = receive(amqp.create_receiver("text", credit=1), 1)
    assert message.body == text and message.durable
    wait_for(lambda: not _bodies(broker), 5, what="the body to go")


def test_a_send_over_4_gib_is_refused_by_its_content_length_with_no_max_message_size(
    scow_broker,
):
    stomp = {"min-large-message-size": LARGE, "max-message-size": 0}  # 0: no limit of its own
    broker = start(scow_broker, sections={"stomp": stomp})
    raw = RawStomp(broker.port_of("stomp"))
    raw.send(b"SEND\ndestination:/queue/huge\nreceipt:r\ncontent-length:%d\n\n" % (4 << 30))
    command, headers, text = raw.read_frame()
    assert command == "ERROR", (command, headers)
    assert b"4294967296 bytes (its content-length) exceeds the 4 GiB" in text, text
    assert b"max-message-size (0)" in text and "4 GiB" in headers["message"], text
    assert _stats(broker) == {"files": 0, "bytes": 0, "arriving": 0}
    with client(broker) as (conn, seen):  # the broker serves others
        conn.send("/queue/huge", b"fits", receipt="ok")
        seen.wait_receipt("ok")


@pytest.mark.slow  # ~1-2 min: 4 GiB through the socket to a file; the parser's test is fast
def test_a_send_without_content_length_over_4_gib_is_refused_with_no_max_message_size(
    scow_broker,
):
    # tests/stomp/test_stomp_frames.py's ..._refused_at_its_first_byte_past: the same
    # check, fed to the parser alone
    stomp = {"min-large-message-size": LARGE, "max-message-size": 0}  # 0: no limit of its own
    broker = start(scow_broker, sections={"stomp": stomp})
    raw = RawStomp(broker.port_of("stomp"))
    raw.sock.settimeout(60)  # the broker writes the body to its file as it comes
    raw.send(b"SEND\ndestination:/queue/huge\nreceipt:r\n\n")
    piece = b"x" * (1 << 20)  # written again and again: the body is never held whole
    for _ in range(MAX_BODY_SIZE >> 20):
        raw.send(piece)
    raw.send(piece[: MAX_BODY_SIZE % len(piece)])
    # all 4 GiB less a byte are in its file (after the message's head), and taken
    wait_for(
        lambda: _files(broker) and _files(broker)[0].stat().st_size > MAX_BODY_SIZE,
        60,
        what="4 GiB less a byte in the file",
    )
    assert select.select([raw.sock], [], [], 0.5)[0] == []  # no ERROR for it
    raw.send(b"x")  # 4 GiB and a byte: one past what an AMQP body section can say
    command, headers, text = raw.read_frame()
    assert command == "ERROR", (command, headers)
    assert b"more than 4294967295 bytes (it has no content-length) exceeds the 4 GiB" in text
    assert b"max-message-size (0)" in text and "4 GiB" in headers["message"], text
    raw.close()
    wait_for(lambda: _stats(broker)["arriving"] == 0, 30, what="the arrival to go")
    assert _stats(broker) == {"files": 0, "bytes": 0, "arriving": 0}
    assert _files(broker) == []
    with client(broker) as (conn, seen):  # the broker serves others
        conn.send("/queue/huge", b"fits", receipt="ok")
        seen.wait_receipt("ok")


@pytest.mark.parametrize(
    ("tail", "says"),
    [
        (b"\xff\xfe", b"must be UTF-8"),
        (b"y" * (1 << 20), b"exceeds [stomp] max-message-size 1048576"),
    ],
    ids=["not-utf8", "too-large"],
)
def test_a_send_without_content_length_refused_mid_body_leaves_nothing(scow_broker, tail, says):
    stomp = {"min-large-message-size": LARGE, "max-message-size": 1 << 20}
    broker = start(scow_broker, sections={"stomp": stomp})
    raw = RawStomp(broker.port_of("stomp"))
    raw.send(b"SEND\ndestination:/queue/bad\nreceipt:r\n\n" + b"x" * (200 << 10))
    wait_for(lambda: _stats(broker)["arriving"] == 1, 10, what="the body to stream")
    raw.send(tail + b"\x00")
    command, _, text = raw.read_frame()
    assert command == "ERROR" and says in text, text
    wait_for(lambda: _stats(broker)["arriving"] == 0, 5, what="the arrival to go")
    assert _files(broker) == []
    assert (broker.queue_stats("bad") or {}).get("message-count", 0) == 0
    with client(broker) as (conn, seen):  # the broker serves others
        conn.send("/queue/bad", b"fine", receipt="ok")
        seen.wait_receipt("ok")


@pytest.mark.parametrize(
    "body",
    [bytes(range(256)) * (12 << 10), ["x" * 100] * 30_000],  # 3 MiB of data; a list
    ids=["data", "list"],
)
@pytest.mark.parametrize("store", DATABASES, indirect=True)
def test_on_the_database_a_stomp_delivery_reads_its_rows_off_the_event_loop(
    scow_broker, store, monkeypatch, body
):
    broker = _start_on(scow_broker, store, {})
    broker.call(lambda: None)
    large = broker.broker.large_messages
    threads: list[int] = []
    fetch = large.fetch

    def fetch_and_say_where(*args):  # the store's own reads, noting the thread they run on
        threads.append(threading.get_ident())
        return fetch(*args)

    monkeypatch.setattr(large, "fetch", fetch_and_say_where)
    with connected(broker.url) as amqp:
        send(amqp, "rows", Message(body=body, durable=True, properties={"n": 1}))
    with client(broker) as (conn, seen):
        conn.subscribe("/queue/rows", id="s")
        (frame,) = seen.wait_messages(1)
    expected = body if isinstance(body, bytes) else str(body).encode()
    assert frame.body == expected and frame.headers["n"] == "1"
    assert threads, "the body was not read from the database"
    assert broker.call(threading.get_ident) not in threads


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "text"])
@pytest.mark.parametrize("store", DATABASES, indirect=True)
def test_a_send_the_database_refuses_gets_an_error_and_its_rows_go(scow_broker, store, length):
    broker = _start_on(scow_broker, store, {"min-large-message-size": LARGE})
    refuse_rows(store)  # from a body's third row on, as if the table went read-only
    body = b"x" * (5 << 20)
    raw = RawStomp(broker.port_of("stomp"))
    head = b"SEND\ndestination:/queue/refused\npersistent:true\nreceipt:r\n"
    raw.send(head + (b"content-length:%d\n" % len(body) if length else b"") + b"\n")
    with contextlib.suppress(OSError):  # the broker may close before it has read all
        raw.send(body + b"\x00")
    command, headers, text = raw.read_frame()
    assert command == "ERROR" and headers.get("receipt-id") == "r"
    assert REFUSED.encode() in text and b"LARGE_MESSAGES" in text, text
    wait_for(lambda: not _bodies(broker), 10, what="the partial rows to go")
    assert _stats(broker) == {"files": 0, "bytes": 0, "arriving": 0}
    assert (broker.queue_stats("refused") or {}).get("message-count", 0) == 0
    with client(broker) as (conn, seen):  # the broker serves others
        conn.send("/queue/refused", b"y" * (3 << 19), headers={"persistent": "true"}, receipt="ok")
        seen.wait_receipt("ok")
    assert broker.queue_stats("refused")["message-count"] == 1


@pytest.mark.slow  # ~16 s with its own server; the refusals above are the fast variant
@pytest.mark.postgres
def test_a_send_across_a_postgresql_outage_waits_for_it_then_is_stored_whole(
    private_postgres, scow_broker
):  # in that order: the broker stops before its database
    """A database lost for less than `jdbc-network-timeout` is an outage, not a refusal
    (the database store retries until it is back): the SEND's rows wait, and its RECEIPT
    comes once PostgreSQL is back, with nothing of the body lost. (Lost for longer, the
    SEND is refused: tests/database/test_database_large_message_outages.py.)"""
    url = private_postgres.url(private_postgres.create_database())
    broker = _start_on(scow_broker, url, {"min-large-message-size": LARGE})
    body = bytes(range(256)) * (24 << 10)  # 6 MiB
    raw = RawStomp(broker.port_of("stomp"))
    raw.send(
        b"SEND\ndestination:/queue/outage\npersistent:true\nreceipt:r\n"
        b"content-length:%d\n\n" % len(body) + body[: 3 << 20]
    )
    wait_for(lambda: sum(1 for _ in _bodies(broker)), 10, what="the first rows")
    private_postgres.stop("fast")
    raw.send(body[3 << 20 :] + b"\x00")
    raw.sock.settimeout(2)
    with pytest.raises(TimeoutError):  # no answer while the database is down
        raw.read_frame()
    private_postgres.start()
    raw.sock.settimeout(60)
    assert raw.read_frame()[:2] == ("RECEIPT", {"receipt-id": "r"})
    raw.close()
    with connected(broker.url) as amqp:
        (message,) = receive(amqp.create_receiver("outage", credit=1), 1)
    assert bytes(message.body) == body


@pytest.mark.postgres
def test_a_large_send_whose_final_sync_fails_gets_an_error_and_its_rows_go(
    private_postgres, scow_broker
):  # in that order: the broker stops before its database
    url = private_postgres.url(private_postgres.create_database())
    kwargs = on_database(
        {"plugins": PLUGINS, "sections": {"stomp": {"min-large-message-size": LARGE}}}, url
    )
    kwargs["sections"]["database"]["jdbc-network-timeout"] = GIVE_UP
    broker = start(scow_broker, **kwargs)
    body = b"b" * (2 << 20)
    raw = RawStomp(broker.port_of("stomp"))
    with lock_row_held(private_postgres, url):
        raw.send(
            b"SEND\ndestination:/queue/synced\npersistent:true\nreceipt:r\n"
            b"content-length:%d\n\n" % len(body) + body + b"\x00"
        )
        # every row is in; the final sync cannot commit while we hold the lock row
        wait_for(lambda: list(stored_bodies(url).values()) == [3], 10, what="every row")
        private_postgres.stop("immediate")  # and now never will: the server is gone
    raw.sock.settimeout(30)
    command, headers, text = raw.read_frame()
    assert command == "ERROR" and headers.get("receipt-id") == "r", (command, headers)
    assert b"could not be synced" in text and b"LARGE_MESSAGES" in text, text
    raw.close()
    private_postgres.start()
    wait_for(lambda: not stored_bodies(url), 30, what="the rows to go")
    assert _stats(broker) == {"files": 0, "bytes": 0, "arriving": 0}
    # STOMP producers are refused while the outage lasts (no flow control to hold them)
    outage = lambda: broker.call(lambda: broker.broker.limits.blocked_by("database"))  # noqa: E731
    wait_for(lambda: not outage(), 30, what="the database back for the broker")
    with client(broker) as (conn, seen):  # the broker serves others
        conn.send("/queue/synced", b"y" * (3 << 19), headers={"persistent": "true"}, receipt="ok")
        seen.wait_receipt("ok")
    assert broker.queue_stats("synced")["message-count"] == 1
