"""SIGKILL of `scow run` at each point of a large message's life: after a restart no file
is left that no message refers to, and no accepted message is lost."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from proton import Message

from scow.core.testing import free_port, wait_for
from scow.protocols.amqp import engine
from tests.stomp.stomp_helpers import RawStomp
from tests.wire.helpers import RawClient, connected, consume_all, pump, receive, send

PLUGINS = ["amqp", "file-journal", "standard-queues", "full-policies"]
LARGE = 64 << 10


def sections(**journal: Any) -> dict[str, dict[str, Any]]:
    return {
        "amqp": {"min-large-message-size": LARGE},
        "journal": {"journal-file-size": "1MiB", **journal},
    }


def large_files(tmp_path: Path) -> list[Path]:
    directory = tmp_path / "data" / "large-messages"
    return sorted(directory.iterdir()) if directory.is_dir() else []


def body_of(size: int, seed: int = 0) -> bytes:
    return bytes((i * 13 + seed) & 0xFF for i in range(256)) * (size // 256)


def send_half(port: int, address: str) -> RawClient:
    """The first 4 MiB of a durable 8 MiB message to `address`, its end never sent."""
    encoded = Message(body=body_of(8 << 20), durable=True).encode()
    client = RawClient(port)
    link = engine.new_sender(client.session, address, address)
    client.until(lambda: engine.link_credit(link) > 0, "credit")
    engine.begin_send(link, b"1", encoded[: 1 << 20])
    for start in range(1 << 20, 4 << 20, 1 << 20):
        engine.send_more(link, encoded[start : start + (1 << 20)])
    client.flush()
    return client


def test_sigkill_mid_arrival_leaves_no_file_and_no_message(scow_broker_process, tmp_path):
    broker = scow_broker_process(plugins=PLUGINS, sections=sections())
    client = send_half(broker.port, "half")
    wait_for(
        lambda: large_files(tmp_path) and large_files(tmp_path)[0].stat().st_size >= 3 << 20,
        10,
        what="the partial message in its file",
    )
    broker.kill()
    client.close()
    restarted = scow_broker_process(plugins=PLUGINS, sections=sections(), port=broker.port)
    assert large_files(tmp_path) == []  # removed at startup: the message never completed
    assert consume_all(restarted.url, "half", quiet=0.5) == []


def test_sigkill_after_the_file_sync_before_the_record(scow_broker_process, tmp_path):
    # a 3 s journal buffer holds the message's record back (the journal just wrote, so
    # it waits that long for more) while its file is written and synced at once
    slow = sections(**{"journal-buffer-timeout": 3_000_000_000})
    broker = scow_broker_process(plugins=PLUGINS, sections=slow)
    body = body_of(1 << 20, seed=1)
    accepted = threading.Event()
    with connected(broker.url) as conn:
        send(conn, "synced", Message(body="small", durable=True))  # the journal writes now

        def produce() -> None:
            try:
                with connected(broker.url) as other:
                    send(other, "synced", Message(body=body, durable=True))
                    accepted.set()
            except Exception:
                return  # killed under it

        thread = threading.Thread(target=produce)
        thread.start()
        wait_for(
            lambda: large_files(tmp_path) and large_files(tmp_path)[0].stat().st_size > len(body),
            10,
            what="the whole file",
        )
        broker.kill()
        thread.join(10)
    assert not accepted.is_set()  # its record had not been written: never accepted
    restarted = scow_broker_process(plugins=PLUGINS, sections=sections(), port=broker.port)
    got = consume_all(restarted.url, "synced", quiet=0.5)
    assert [m.body for m in got] == ["small"]  # the large one was never accepted
    assert large_files(tmp_path) == []  # its synced file, which no record refers to, went


def test_sigkill_mid_delivery_keeps_the_message_whole(scow_broker_process, tmp_path):
    broker = scow_broker_process(plugins=PLUGINS, sections=sections())
    body = body_of(16 << 20, seed=2)
    with connected(broker.url) as conn:
        send(conn, "streamed", Message(body=body, durable=True))
    client = RawClient(broker.port)
    engine.new_receiver(client.session, "slow", "streamed", 1)
    # read 2 MiB of the 16 and stop reading: the broker is mid-stream, held by the socket
    client.until(lambda: client.received > 2 << 20, "part of the message")
    broker.kill()
    client.close()
    restarted = scow_broker_process(plugins=PLUGINS, sections=sections(), port=broker.port)
    assert len(large_files(tmp_path)) == 1
    with connected(restarted.url) as conn:
        (got,) = receive(conn.create_receiver("streamed", credit=1), 1)
    assert got.body == body
    wait_for(lambda: not large_files(tmp_path), 5, what="the file to go with the ack")


def test_sigkill_mid_deletion_leaves_no_file_and_delivers_no_partial(scow_broker_process, tmp_path):
    # the file goes at the acknowledgement while its delete record waits in the journal's
    # 3 s buffer: the restart finds a record whose file is gone
    slow = sections(**{"journal-buffer-timeout": 3_000_000_000})
    broker = scow_broker_process(plugins=PLUGINS, sections=slow)
    body = body_of(1 << 20, seed=3)
    with connected(broker.url) as conn:
        send(conn, "deleted", Message(body=body, durable=True))
        receiver = conn.create_receiver("deleted", credit=1)
        receiver.receive(timeout=10)
        time.sleep(0.2)  # past the journal's last write: the delete record is held back
        receiver.accept()
        pump([conn], lambda: not large_files(tmp_path), 5, what="the file to go")
        broker.kill()
    restarted = scow_broker_process(plugins=PLUGINS, sections=sections(), port=broker.port)
    assert consume_all(restarted.url, "deleted", quiet=0.5) == []  # acknowledged: gone
    assert large_files(tmp_path) == []


def test_accepted_large_messages_survive_sigkill(scow_broker_process, tmp_path):
    broker = scow_broker_process(plugins=PLUGINS, sections=sections())
    bodies = [body_of(256 << 10, seed=i) for i in range(5)]
    with connected(broker.url) as conn:
        send(conn, "kept", *(Message(body=b, durable=True) for b in bodies))
    broker.kill()
    restarted = scow_broker_process(plugins=PLUGINS, sections=sections(), port=broker.port)
    assert len(large_files(tmp_path)) == 5
    assert [bytes(m.body) for m in consume_all(restarted.url, "kept", quiet=0.5)] == bodies
    wait_for(lambda: not large_files(tmp_path), 5, what="the files to go")


def test_paged_large_messages_survive_sigkill_and_their_files_go_with_their_pages(
    scow_broker_process, tmp_path
):
    plugins = [*PLUGINS, "paging"]
    paging = {"#": {"max-size-bytes": 10_000, "page-size-bytes": 8_000}}
    broker = scow_broker_process(plugins=plugins, sections=sections(), address_settings=paging)
    bodies = [body_of(256 << 10, seed=i) for i in range(4)]
    with connected(broker.url) as conn:
        send(conn, "paged", *(Message(body="s" * 500, durable=True) for _ in range(40)))
        send(conn, "paged", *(Message(body=b, durable=True) for b in bodies))
    assert len(large_files(tmp_path)) == 4
    broker.kill()
    restarted = scow_broker_process(
        plugins=plugins, sections=sections(), address_settings=paging, port=broker.port
    )
    assert len(large_files(tmp_path)) == 4  # the pages' records refer to them: kept
    got = consume_all(restarted.url, "paged", quiet=0.5)
    assert [bytes(m.body) for m in got[40:]] == bodies
    wait_for(lambda: not large_files(tmp_path), 10, what="the files to go with their pages")


def test_scow_data_export_and_import_carry_large_messages(scow_broker_process, tmp_path):
    plugins = [*PLUGINS, "paging"]
    paging = {"paged": {"max-size-bytes": 10_000, "page-size-bytes": 8_000}}
    broker = scow_broker_process(plugins=plugins, sections=sections(), address_settings=paging)
    bodies = [body_of(200 << 10, seed=i) for i in range(2)]
    with connected(broker.url) as conn:
        send(conn, "kept", *(Message(body=b, durable=True, subject="k") for b in bodies))
        send(conn, "paged", *(Message(body="s" * 500, durable=True) for _ in range(40)))
        send(conn, "paged", *(Message(body=b, durable=True) for b in bodies))
    assert broker.stop() == 0
    data, export, fresh = tmp_path / "data", tmp_path / "export.jsonl", tmp_path / "fresh"
    scow = [sys.executable, "-m", "scow.core.cli", "data"]
    for args in (
        ["export", "--data-dir", str(data), "--output", str(export)],
        ["import", "--data-dir", str(fresh), "--input", str(export)],
    ):
        run = subprocess.run([*scow, *args], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
    assert len(list((fresh / "large-messages").iterdir())) == 4
    data.rename(tmp_path / "old")
    fresh.rename(data)
    restarted = scow_broker_process(
        plugins=plugins, sections=sections(), address_settings=paging, port=broker.port
    )
    kept = consume_all(restarted.url, "kept", quiet=0.5)
    assert [(bytes(m.body), m.subject) for m in kept] == [(b, "k") for b in bodies]
    paged = consume_all(restarted.url, "paged", quiet=0.5)
    assert [bytes(m.body) for m in paged[40:]] == bodies
    wait_for(lambda: not large_files(tmp_path), 10, what="the files to go")


def test_large_messages_interleaved_on_two_links_of_one_connection_arrive_whole(
    scow_broker_process,
):
    broker = scow_broker_process(plugins=PLUGINS, sections=sections())
    client = RawClient(broker.port)
    second = engine.new_session(client.engine.connection)
    links = [
        engine.new_sender(client.session, "a", "mixed"),
        engine.new_sender(second, "b", "mixed"),
    ]
    client.until(lambda: all(engine.link_credit(link) > 0 for link in links), "credit")
    encoded = [
        Message(body=body_of(4 << 20, seed=i), durable=True, properties={"n": i}).encode()
        for i in range(2)
    ]
    deliveries = [engine.begin_send(link, b"t", b"") for link in links]
    for start in range(0, len(encoded[0]), 256 << 10):  # the two messages' frames interleave
        for link, data in zip(links, encoded, strict=True):
            engine.send_more(link, data[start : start + (256 << 10)])
        client.read(0.01)
    for link in links:
        engine.link_advance(link)
    client.until(lambda: all(engine.delivery_remote_state(d) for d in deliveries), "both outcomes")
    assert [engine.delivery_remote_state(d) for d in deliveries] == [engine.ACCEPTED] * 2
    client.close()
    got = consume_all(broker.url, "mixed", quiet=0.5)
    assert sorted((m.properties["n"], bytes(m.body)) for m in got) == [
        (i, body_of(4 << 20, seed=i)) for i in range(2)
    ]


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "text"])
def test_sigkill_mid_stomp_send_leaves_no_file_and_keeps_the_receipted_message(
    scow_broker_process, tmp_path, length
):
    """With a content-length, or without (a text body streamed once it passes
    min-large-message-size, its size written at its end)."""
    stomp_port = free_port()
    stomp = {
        "listen": [f"127.0.0.1:{stomp_port}"],
        "anycast-prefix": "/queue/",
        "min-large-message-size": LARGE,
    }
    kwargs = {"plugins": [*PLUGINS, "stomp"], "sections": {**sections(), "stomp": stomp}}
    broker = scow_broker_process(**kwargs)
    client = RawStomp(stomp_port)

    def send(receipt: bytes, body: bytes, size: int) -> None:
        head = b"SEND\ndestination:/queue/cut\npersistent:true\nreceipt:%s\n" % receipt
        client.send(head + (b"content-length:%d\n" % size if length else b"") + b"\n" + body)

    whole = body_of(1 << 20, seed=1) if length else b"w" * (1 << 20)
    send(b"r", whole + b"\x00", len(whole))
    assert client.read_frame()[:2] == ("RECEIPT", {"receipt-id": "r"})
    send(b"never", body_of(3 << 20, seed=2) if length else b"n" * (3 << 20), 8 << 20)  # of 8
    wait_for(
        lambda: max((p.stat().st_size for p in large_files(tmp_path)), default=0) > 3 << 20,
        10,
        what="the partial SEND in its file",
    )
    broker.kill()
    client.close()
    restarted = scow_broker_process(**kwargs, port=broker.port)
    assert len(large_files(tmp_path)) == 1  # the partial SEND's file removed at startup
    # proton may hand a binary body over as a memoryview, which compares unequal to the
    # same bytes when its format is not "B"
    got = [
        m.body if isinstance(m.body, str) else bytes(m.body)
        for m in consume_all(restarted.url, "cut", quiet=0.5)
    ]
    assert got == ([whole] if length else [whole.decode()])
    wait_for(lambda: not large_files(tmp_path), 5, what="the file to go")
