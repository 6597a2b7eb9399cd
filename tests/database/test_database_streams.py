"""Streams on the database store: a broker whose journal is in the database keeps its
streams there too (records and cursors), and `scow data export`/`import` carry streams
between segment files and a database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from proton import Message

from scow.core import cli
from scow.core.testing import BrokerThread, broker_config, write_config
from tests.database.backends import on_database
from tests.spark.conftest import PLUGINS, client, publish, stream, wait_stream

#: Small segments: the streams below span several, so retention and reads cross them.
QUEUES = {"queues": {"s": stream(**{"segment-bytes": 2000})}}


def _config(tmp_path: Path, name: str, database_url: str | None) -> Path:
    kwargs: dict[str, Any] = {"plugins": PLUGINS, "sections": QUEUES}
    if database_url is not None:
        kwargs = on_database(kwargs, database_url)
    return write_config(tmp_path / f"{name}.toml", broker_config(tmp_path / name, **kwargs))


def _read(broker: BrokerThread) -> list[tuple[int, Any]]:
    """(sequence, message id) of every record of stream 's', and its cursor 'q'."""
    c = client(broker.url)
    try:
        got = [m for batch in c.read("s", 0, 10**9) for m in batch]
        cursor = c.call("stream", "s", "CURSOR-READ", {"cursor": "q"})["sequence"]
    finally:
        c.close()
    messages = [Message() for _ in got]
    for message, data in zip(messages, got, strict=True):
        message.decode(data)
    return [(m.annotations["x-opt-sequence-number"], m.id) for m in messages] + [("cursor", cursor)]


def _fill(broker: BrokerThread, count: int) -> None:
    publish(broker.url, "s", [f"m{i:03d}" + "x" * 200 for i in range(count)])
    wait_stream(broker, "s", count)
    c = client(broker.url)
    try:
        c.call("stream", "s", "CURSOR-MOVE", {"cursor": "q", "sequence": count // 2})
    finally:
        c.close()


def test_a_broker_on_the_database_store_keeps_its_streams_in_the_database(
    tmp_path: Path, database_url: str
) -> None:
    config = _config(tmp_path, "db", database_url)
    broker = BrokerThread(config).start()
    try:
        _fill(broker, 40)
        before = _read(broker)
    finally:
        broker.stop()
    assert [seq for seq, _id in before[:-1]] == list(range(40))
    assert before[-1] == ("cursor", 20)
    assert not list((tmp_path / "db").rglob("*.seg")), "stream records went to files"
    assert not list((tmp_path / "db").rglob("cursors.json"))
    broker = BrokerThread(config).start()  # and they come back from the database
    try:
        assert _read(broker) == before
        publish(broker.url, "s", ["after"])
        wait_stream(broker, "s", 41)
        assert _read(broker)[-2] == (40, "after")  # sequence numbers go on
    finally:
        broker.stop()


def test_export_and_import_carry_streams_between_files_and_a_database(
    tmp_path: Path, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    files = BrokerThread(_config(tmp_path, "files", None)).start()
    try:
        _fill(files, 30)
        expected = _read(files)
    finally:
        files.stop()
    exported = tmp_path / "files.jsonl"
    data = ["--data-dir", str(tmp_path / "files")]
    assert cli.main(["data", "export", *data, "--output", str(exported)]) == 0
    assert "'streams': 1, 'stream-records': 30" in capsys.readouterr().out
    db_config = _config(tmp_path, "db", database_url)
    assert cli.main(["data", "import", "--config", str(db_config), "--input", str(exported)]) == 0
    again = tmp_path / "db.jsonl"
    assert cli.main(["data", "export", "--config", str(db_config), "--output", str(again)]) == 0
    assert "'stream-records': 30" in capsys.readouterr().out
    back = ["--data-dir", str(tmp_path / "back")]
    assert cli.main(["data", "import", *back, "--input", str(again)]) == 0

    on_db = BrokerThread(db_config).start()
    try:
        assert _read(on_db) == expected
    finally:
        on_db.stop()
    back_config = write_config(
        tmp_path / "back.toml",
        broker_config(tmp_path / "back", plugins=PLUGINS, sections=QUEUES),
    )
    on_files = BrokerThread(back_config).start()
    try:
        assert _read(on_files) == expected
    finally:
        on_files.stop()


def test_a_spark_commit_stores_its_packed_rows_in_a_stream_on_the_database(
    tmp_path: Path, database_url: str
) -> None:
    """A committed pack's rows are stored with ids from 2**63 up (`row_id`); the
    database's signed id column once refused them, and the stream's writer retried for
    ever with every row held in the journal."""
    pa = pytest.importorskip("pyarrow")
    from scow.plugins.spark.source import Options, commit, stage
    from tests.spark.conftest import stream_bodies

    config = _config(tmp_path, "db", database_url)
    bodies = [b"r%05d" % i for i in range(1500)]  # packs of several rows each
    broker = BrokerThread(config).start()
    try:
        options = Options.parse({"url": broker.url, "address": "s"})
        batch = pa.RecordBatch.from_arrays([pa.array(bodies)], ["body"])
        commit(options, "sink", 0, [stage(options, "sink", 0, iter([batch]))])
        wait_stream(broker, "s", len(bodies))
        assert broker.call(lambda: broker.broker.queues["s"].stats()["write-errors"]) == 0
    finally:
        broker.stop()
    broker = BrokerThread(config).start()  # from the database, once each
    try:
        assert stream_bodies(broker.url, "s", len(bodies)) == bodies
    finally:
        broker.stop()
