"""An export taken after a crash that came between a stream's append of a committed
pack's rows and the journal's delete of the pack (both hold them, before any restart)
writes each row once: a stream that holds all of the pack's rows is left out of its
message line, one that holds the first rows gets a pack of the others; an import then
gives each queue exactly what it held, in order."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from proton import Message

from scow.core import cli
from scow.core.message import PackedRows
from scow.core.storage import StorageManager
from scow.core.testing import BrokerProcess, BrokerThread, free_port, scow_command, wait_for
from scow.plugins.file_journal.journal import FileJournal
from scow.plugins.file_journal.plugin import journal_settings
from scow.plugins.spark import segments
from scow.plugins.spark.plugin import StreamOpener, opener
from scow.plugins.spark.records import (
    DURABLE_HEADER,
    MalformedPack,
    annotate,
    pack,
    row_id,
    rows_after,
    unpack,
)
from scow.protocols.amqp.codec import encode_message
from tests.spark.conftest import client, stream, wait_stream

BODIES = [b"row-%03d" % n for n in range(5)]
ROWS = [encode_message(body, durable=True) for body in BODIES]


#: Two streams on one address: a pack routed to it goes whole to both.
TWO_STREAMS = {
    name: {"address": "out", "routing-type": "MULTICAST", "arguments": stream()["arguments"]}
    for name in ("a", "b")
}


def _storage(data: Path) -> StorageManager:
    return StorageManager(
        FileJournal(journal_settings(data, "bindings", {})),
        FileJournal(journal_settings(data, "messages", {})),
    )


def crash_state(config: Path, data: Path, stored: Mapping[str, int], rows: list[bytes]) -> None:
    """The data dir `data` of the broker of `config` (which declares the streams of
    `stored`) as a SIGKILL leaves it after a committed pack of `rows` was routed whole to
    those streams: the journal holds the pack (PACKED_ROWS) and the store of each stream
    holds as many of its first rows as `stored` says, as the stream's writer stores them."""
    BrokerThread(config).start().stop()  # the queues' records
    storage = _storage(data)
    queue_ids = {q["name"]: q["id"] for q in storage.load().queues}
    pack_id = storage.next_id()
    queues = [queue_ids[name] for name in stored]
    storage.store_message(pack_id, "out", 0, 4, queues, PackedRows(pack(rows, durable=True)), None)
    storage.flush()
    storage.stop()
    open_stream = opener(segments.BACKEND, data, {})
    for name, count in stored.items():
        store = open_stream(name, {})
        store.open()
        now = int(time.time() * 1000)
        records = [(n, now, row_id(pack_id, n), annotate(rows[n], n, now)) for n in range(count)]
        if records:
            store.append(records)
        store.close()


def test_what_a_store_lacks_of_a_pack_is_the_rest_of_its_rows_after_its_own_header() -> None:
    whole = pack(ROWS, durable=True)
    rows_left = StreamOpener.rows_left
    assert rows_left(set(), 9, whole) is whole
    recent = {row_id(9, 0), row_id(9, 1), row_id(8, 2), 9}
    rest = rows_left(recent, 9, whole)
    assert rest == pack(ROWS[2:], durable=True) == rows_after(whole, 2)
    assert recent == {row_id(8, 2), 9}  # the ids found were taken out, as recovery does
    assert rows_left({row_id(9, n) for n in range(5)}, 9, whole) is None
    assert rows_after(pack(ROWS), 4) == pack(ROWS[4:])  # no header: none
    cut = whole[:-1]
    assert rows_left({row_id(9, 0)}, 9, cut) is cut  # malformed: the stream refuses it
    with pytest.raises(MalformedPack):
        rows_after(cut, 1)


def _body(data: bytes) -> bytes:
    message = Message()
    message.decode(data)
    return bytes(message.body)


def rows_by_queue(lines: list[dict[str, Any]]) -> dict[str, list[bytes]]:
    """The bodies each queue gets from an export's lines (a stream's records, and the
    messages to "out", or a pack's rows, that name it), sorted: each as often as the
    lines hold it."""
    found: dict[str, list[bytes]] = {}
    for line in lines:
        if (
            line.get("type") not in ("message", "stream-record")
            or line.get("address", "out") != "out"
        ):
            continue  # (a sink's marker is a message of its own address)
        data = base64.b64decode(line["data"])
        rows: list[bytes] = []
        if not (line.get("packed") and unpack(data, rows)):
            rows = [data]
        for queue in line["queues"] if line["type"] == "message" else [line["queue"]]:
            found.setdefault(queue, []).extend(_body(row) for row in rows)
    return {queue: sorted(bodies) for queue, bodies in found.items()}


def _stream_bodies(url: str, queue: str, count: int) -> list[bytes]:
    """The bodies of the first `count` records of stream `queue` (on address "out"), and
    of one more if any."""
    reader = client(url)
    try:
        return [
            _body(m) for batch in reader.read(queue, 0, count + 1, address="out") for m in batch
        ]
    finally:
        reader.close()


def _export(config: Path, out: Path) -> list[dict[str, Any]]:
    assert cli.main(["data", "export", "--config", str(config), "--output", str(out)]) == 0
    return [json.loads(text) for text in out.open()]


@pytest.mark.parametrize("stored", [0, 2, 5])
def test_an_export_after_a_crash_writes_each_row_of_a_committed_pack_once(
    streams, tmp_path: Path, stored: int
) -> None:
    queues = {"out": stream()}
    config = streams.config(queues)
    crash_state(config, tmp_path / "data", {"out": stored}, ROWS)
    lines = _export(config, tmp_path / "export.jsonl")
    assert rows_by_queue(lines) == {"out": BODIES}
    messages = [line for line in lines if line.get("type") == "message"]
    assert len(messages) == (stored < len(ROWS))
    assert all(line["packed"] is True for line in messages)
    # the rest of a pack is a pack after the same (durable) header
    assert all(base64.b64decode(line["data"]).startswith(DURABLE_HEADER) for line in messages)
    assert lines[-1]["messages"] == len(messages)
    assert lines[-1]["stream-records"] == stored

    broker = imported(streams, queues, tmp_path / "export.jsonl")
    assert _stream_bodies(broker.url, "out", len(ROWS)) == BODIES
    assert broker.queue_stats("out")["next-sequence"] == len(ROWS)


def imported(streams, queues: dict[str, Any], exported: Path) -> BrokerThread:
    """A broker started on a fresh data dir into which `exported` was imported, once its
    streams have stored the rows the import gave them."""
    fresh = ["--config", str(streams.config(queues, name="fresh"))]
    assert cli.main(["data", "import", *fresh, "--input", str(exported)]) == 0
    broker = streams.start(queues, name="fresh")
    for name, queue in queues.items():
        if queue.get("arguments", {}).get("x-queue-type") == "stream":
            wait_stream(broker, name, len(ROWS))
    return broker


@pytest.mark.parametrize("stored", [{"a": 2, "b": 0}, {"a": 5, "b": 2}, {"a": 5, "b": 5}])
def test_two_streams_of_one_pack_each_get_the_rows_their_store_lacks(
    streams, tmp_path: Path, stored: dict[str, int]
) -> None:
    config = streams.config(TWO_STREAMS)
    crash_state(config, tmp_path / "data", stored, ROWS)
    lines = _export(config, tmp_path / "export.jsonl")
    assert rows_by_queue(lines) == {"a": BODIES, "b": BODIES}
    # one line per rest of the pack: the streams that lack the same rows share it
    messages = [line for line in lines if line.get("type") == "message"]
    assert len(messages) == len({n for n in stored.values() if n < len(ROWS)})

    broker = imported(streams, TWO_STREAMS, tmp_path / "export.jsonl")
    for name in TWO_STREAMS:
        assert _stream_bodies(broker.url, name, len(ROWS)) == BODIES
        assert broker.queue_stats(name)["next-sequence"] == len(ROWS)


#: A stream and a standard queue on one address: a committed pack goes to it as its rows.
STREAM_AND_QUEUE = {"a": TWO_STREAMS["a"], "plain": {"address": "out", "routing-type": "MULTICAST"}}


def test_a_pack_for_a_stream_and_a_standard_queue_is_journaled_as_its_rows(
    streams, tmp_path: Path
) -> None:
    """What the broker does with a committed pack when its address also has a standard
    queue: each row is a message of its own for both queues (no PACKED_ROWS record), so
    an export needs nothing of packs for it."""
    broker = streams.start(STREAM_AND_QUEUE)
    driver = client(broker.url)
    try:
        to = {"batch": 0, "partition": 0, "attempt": 0, "to": "out"}
        staging = driver.call("stream-sink", "s", "STAGE", to)["address"]
        assert driver.send(staging, [pack(ROWS, durable=True)]) == 1
        driver.call("stream-sink", "s", "COMMIT", {"batch": 0}, [[0, 0]])
    finally:
        driver.close()
    wait_stream(broker, "a", len(ROWS))
    broker.stop()
    storage = _storage(tmp_path / "data")
    try:
        recovered = storage.load()
    finally:
        storage.stop()
    plain = [q["id"] for q in recovered.queues if q["name"] == "plain"]
    kept = [m for m in recovered.messages if m.address == "out"]
    assert [(_body(m.data), list(m.queues)) for m in kept] == [(b, plain) for b in BODIES]
    assert not [m for m in kept if m.data.__class__ is PackedRows]

    lines = _export(streams.config(STREAM_AND_QUEUE), tmp_path / "export.jsonl")
    assert rows_by_queue(lines) == {"a": BODIES, "plain": BODIES}


def test_rows_a_crash_left_in_a_stream_and_a_standard_queue_are_exported_once_each(
    streams, tmp_path: Path
) -> None:
    """The same commit, the broker SIGKILLed while the stream had stored its first rows:
    the journal still names the stream for every row; the export leaves it out of the
    rows its store holds, and the standard queue keeps them all."""
    config = streams.config(STREAM_AND_QUEUE)
    data = tmp_path / "data"
    BrokerThread(config).start().stop()
    storage = _storage(data)
    queue_ids = {q["name"]: q["id"] for q in storage.load().queues}
    ids = []
    for row in ROWS:
        ids.append(storage.next_id())
        storage.store_message(ids[-1], "out", 0, 4, list(queue_ids.values()), row, None)
    storage.flush()
    storage.stop()
    store = opener(segments.BACKEND, data, {})("a", {})
    store.open()
    now = int(time.time() * 1000)
    store.append([(n, now, ids[n], annotate(ROWS[n], n, now)) for n in range(2)])
    store.close()

    lines = _export(config, tmp_path / "export.jsonl")
    assert rows_by_queue(lines) == {"a": BODIES, "plain": BODIES}
    broker = imported(streams, STREAM_AND_QUEUE, tmp_path / "export.jsonl")
    assert _stream_bodies(broker.url, "a", len(ROWS)) == BODIES
    assert broker.queue_stats("a")["next-sequence"] == len(ROWS)
    assert broker.queue_stats("plain")["message-count"] == len(ROWS)


def test_scow_data_export_after_a_crash_and_import_give_a_scow_run_each_row_once(
    streams, tmp_path: Path
) -> None:
    """The commands as a user runs them: `scow data export --data-dir` on the crash's data
    dir, `scow data import` into a fresh one, then `scow run` on it."""
    queues = {"out": stream()}
    crash_state(streams.config(queues), tmp_path / "data", {"out": 2}, ROWS)
    exported = tmp_path / "export.jsonl"
    fresh = tmp_path / "fresh" / "data"
    for command in (
        ["export", "--data-dir", str(tmp_path / "data"), "--output", str(exported)],
        ["import", "--data-dir", str(fresh), "--input", str(exported)],
    ):
        done = subprocess.run(
            [scow_command(), "data", *command], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
    lines = [json.loads(text) for text in exported.open()]
    assert rows_by_queue(lines) == {"out": BODIES}

    port = free_port()
    config = streams.config(queues, port=port, name="fresh")
    broker = BrokerProcess(config, port, tmp_path / "broker.log").start()
    try:
        wait_for(lambda: len(_stream_bodies(broker.url, "out", len(ROWS))) == len(ROWS))
        assert _stream_bodies(broker.url, "out", len(ROWS)) == BODIES
    finally:
        assert broker.stop() == 0
