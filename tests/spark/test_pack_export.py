"""A committed pack still in the journal when the data is exported (its stream's store
refused the rows) keeps its mark (`PackedRows`) through export and import: the stream
of the broker started on the imported data stores it as its rows, each once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scow.core import cli
from scow.core.export import ExportError, _message_data
from scow.core.message import PackedRows
from scow.core.testing import wait_for
from tests.spark.conftest import stream, stream_bodies, wait_stream
from tests.tmpfs import fill, tmpfs


def test_a_pack_journaled_before_its_stream_stored_it_is_imported_as_its_rows(
    streams, tmp_path: Path
) -> None:
    pa = pytest.importorskip("pyarrow")
    from scow.plugins.spark.source import Options, commit, stage

    queues = {"out": stream()}
    bodies = [b"r%05d" % i for i in range(300)]
    exported = tmp_path / "export.jsonl"
    # the stream's segments on a file system that is full: the rows stay in the journal
    with tmpfs(tmp_path / "data" / "streams", "1m") as segments:
        broker = streams.start(queues)
        fill(segments)
        options = Options.parse({"url": broker.url, "address": "out"})
        batch = pa.RecordBatch.from_arrays([pa.array(bodies)], ["body"])
        commit(options, "sink", 0, [stage(options, "sink", 0, iter([batch]))])
        wait_for(lambda: broker.queue_stats("out")["writes-held"] > 0, what="the rows held")
        broker.stop()
        config = ["--config", str(streams.config(queues))]
        assert cli.main(["data", "export", *config, "--output", str(exported)]) == 0
    fresh = ["--config", str(streams.config(queues, name="fresh"))]
    assert cli.main(["data", "import", *fresh, "--input", str(exported)]) == 0
    broker = streams.start(queues, name="fresh")
    wait_stream(broker, "out", len(bodies))
    assert stream_bodies(broker.url, "out", len(bodies)) == bodies
    assert broker.queue_stats("out")["next-sequence"] == len(bodies)
    lines = [json.loads(text) for text in exported.open()]
    (pack,) = [m for m in lines if m.get("type") == "message" and "out" in m["queues"]]
    assert pack["packed"] is True


def test_a_message_line_without_packed_imports_as_one_message_and_a_bad_mark_is_refused() -> None:
    line = {"id": 7, "data": "aGk="}  # as a file written before packs were exported
    assert _message_data(line, 3).__class__ is bytes
    assert _message_data({**line, "packed": True}, 3).__class__ is PackedRows
    with pytest.raises(ExportError, match="line 3: message 7: packed must be true or absent"):
        _message_data({**line, "packed": "yes"}, 3)
    with pytest.raises(ExportError, match="neither large nor paged"):
        _message_data({**line, "packed": True, "paged": True}, 3)
