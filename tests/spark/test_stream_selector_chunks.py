"""Streams read with a selector: chunks of records whose summaries prove the selector
wants none of them are passed over unread, summaries missing after a restart are rebuilt
by the first read, and selectors summaries cannot serve still find every match."""

from __future__ import annotations

from pathlib import Path

from proton import Described, symbol

from scow.core.selector import SelectorFilter, compile_selector
from scow.core.testing import broker_processes, wait_for
from scow.plugins.paging.selecting import RecordFilter
from scow.plugins.spark.chunks import CHUNK, ChunkSummaries
from scow.protocols.amqp.codec import encode_message
from scow.protocols.amqp.format import AmqpMessageFormat
from tests.spark.conftest import PLUGINS, management, publish, stream
from tests.spark.test_stream_queue import receive_bodies

#: Whole chunks of blue, then the red ones in the chunk after them.
BLUE_CHUNKS = 2
BLUE = BLUE_CHUNKS * CHUNK
RED = 5
OFFSET = symbol("scow:stream-offset")


def _selector(text: str) -> dict:
    return {
        OFFSET: "first",
        symbol("selector"): Described(symbol("apache.org:selector-filter:string"), text),
    }


def _stats(broker) -> dict:
    return management(broker.url, "stream", "s", "READ")


def _stored(broker, count: int) -> None:
    wait_for(lambda: _stats(broker)["next-sequence"] >= count, what=f"{count} stored")


def _fill(broker) -> None:
    publish(broker.url, "s", [f"b{i}" for i in range(BLUE)], app=lambda _b: {"color": "blue"})
    publish(broker.url, "s", [f"r{i}" for i in range(RED)], app=lambda _b: {"color": "red"})
    _stored(broker, BLUE + RED)


def _reds(broker, selector: str) -> list[int]:
    got = receive_bodies(broker.url, "s", _selector(selector), RED)
    assert [m.id for m in got] == [f"r{i}" for i in range(RED)]
    return [m.annotations["x-opt-sequence-number"] for m in got]


def test_a_selector_read_passes_over_chunks_whose_summaries_refuse_it(streams):
    broker = streams.start({"s": stream()})
    _fill(broker)
    assert _stats(broker)["chunk-summaries"] == BLUE_CHUNKS + 1  # the writer made them
    assert _reds(broker, "color = 'red'") == list(range(BLUE, BLUE + RED))
    assert _stats(broker)["chunks-skipped"] == BLUE_CHUNKS
    # IN is served too; a chunk holding the value is read
    _reds(broker, "color IN ('red', 'green')")
    assert _stats(broker)["chunks-skipped"] == 2 * BLUE_CHUNKS


def test_a_selector_summaries_cannot_serve_still_finds_every_match(streams):
    broker = streams.start({"s": stream()})
    _fill(broker)
    assert _reds(broker, "color LIKE 'r%'") == list(range(BLUE, BLUE + RED))
    assert _stats(broker)["chunks-skipped"] == 0


def test_summaries_lost_at_a_restart_are_rebuilt_by_the_first_selector_read(tmp_path: Path):
    sections = {"queues": {"s": stream()}}
    with broker_processes(tmp_path) as start:
        broker = start(plugins=PLUGINS, sections=sections)
        _fill(broker)
        assert broker.stop() == 0
        broker = start(plugins=PLUGINS, sections=sections, port=broker.port)
        assert _stats(broker)["chunk-summaries"] == 0
        assert _reds(broker, "color = 'red'") == list(range(BLUE, BLUE + RED))
        stats = _stats(broker)
        # the first read scanned every chunk and summarized the blue ones it read whole
        # (the red one, begun before the restart and written to since, stays without one)
        assert (stats["chunks-skipped"], stats["chunk-summaries"]) == (0, BLUE_CHUNKS)
        _reds(broker, "color = 'red'")
        assert _stats(broker)["chunks-skipped"] == BLUE_CHUNKS
        # what is sent after the restart is still found
        publish(broker.url, "s", ["late"], app=lambda _b: {"color": "green"})
        _stored(broker, BLUE + RED + 1)
        got = receive_bodies(broker.url, "s", _selector("color = 'green'"), 1)
        assert [m.id for m in got] == ["late"]


def _record(color: str) -> bytes:
    return encode_message("x", application_properties={"color": color})


def test_chunk_summaries_skip_only_whole_refusing_chunks_and_forget_what_retention_deleted():
    fmt = AmqpMessageFormat()
    chunks = ChunkSummaries(fmt.properties)
    red = RecordFilter([SelectorFilter(compile_selector("color = 'red'"))], fmt.properties)
    # written from the middle of chunk 0 (begun before a restart: no summary), then
    # chunk 1 all blue, chunk 2 blue with one red record
    chunks.appended([(seq, _record("blue")) for seq in range(CHUNK // 2, 2 * CHUNK)])
    chunks.appended([(2 * CHUNK, _record("blue")), (2 * CHUNK + 1, _record("red"))])
    assert len(chunks) == 2
    assert chunks.skip(0, 3 * CHUNK, red) == 0  # chunk 0 has no summary: read
    assert chunks.skip(CHUNK + 5, 3 * CHUNK, red) == 2 * CHUNK
    assert chunks.skip(CHUNK, CHUNK + 10, red) == CHUNK + 10  # not past the end asked for
    # a read from chunk 0's start that covered it summarizes it
    chunks.rebuild(0, [(seq, 0, _record("blue")) for seq in range(CHUNK)], CHUNK)
    assert chunks.skip(0, 3 * CHUNK, red) == 2 * CHUNK
    # one that began inside a chunk, or stopped inside one, does not
    again = ChunkSummaries(fmt.properties)
    again.rebuild(1, [(seq, 0, _record("blue")) for seq in range(1, CHUNK)], CHUNK)
    again.rebuild(CHUNK, [(seq, 0, _record("blue")) for seq in range(CHUNK, CHUNK + 9)], CHUNK + 9)
    assert len(again) == 0
    chunks.forget_before(2 * CHUNK)
    assert len(chunks) == 1  # chunk 2's, which still holds records


def test_records_whose_only_property_is_a_duplicate_id_never_let_a_selector_on_it_skip():
    import pyarrow as pa

    from scow.plugins.spark.records import annotate
    from scow.plugins.spark.schema import messages_of

    fmt = AmqpMessageFormat()
    chunks = ChunkSummaries(fmt.properties)
    rows = pa.RecordBatch.from_arrays([pa.array([b"x"] * CHUNK)], ["body"])
    # the sink's rows as stored: read as "any id" without parsing
    stored = [annotate(m, seq, 0) for seq, m in enumerate(messages_of(rows, "job:0:0:"))]
    chunks.appended(enumerate(stored))
    # then a chunk of rows with a second property: parsed, their ids summarized
    tagged = [
        annotate(encode_message(b"x", durable=True, application_properties=p), seq, 0)
        for seq, p in (
            (CHUNK + n, {"_AMQ_DUPL_ID": f"other:{n}", "color": "blue"}) for n in range(CHUNK)
        )
    ]
    chunks.appended([(CHUNK + n, data) for n, data in enumerate(tagged)])
    chunks.appended([(2 * CHUNK, annotate(encode_message(b"x"), 2 * CHUNK, 0))])  # closes 1

    def selecting(text: str) -> RecordFilter:
        return RecordFilter([SelectorFilter(compile_selector(text))], fmt.properties)

    one = selecting("_AMQ_DUPL_ID = 'job:0:0:7'")
    assert chunks.skip(0, 2 * CHUNK, one) == 0  # chunk 0 may hold it: read
    assert chunks.skip(CHUNK, 2 * CHUNK, one) == 2 * CHUNK  # chunk 1 proves it does not
    assert chunks.skip(0, 2 * CHUNK, selecting("color = 'blue'")) == CHUNK  # 0 has no color


def test_records_that_are_a_body_alone_are_summarized_as_having_no_property():
    import pyarrow as pa

    from scow.plugins.spark.records import annotate
    from scow.plugins.spark.schema import messages_of

    fmt = AmqpMessageFormat()
    parsed: list[bytes] = []

    def properties(data: bytes):
        parsed.append(data)
        return fmt.properties(data)

    chunks = ChunkSummaries(properties)
    rows = pa.RecordBatch.from_arrays([pa.array([b"x"] * CHUNK)], ["body"])
    # a batch write's rows as stored (durable, no id): summarized without a parse
    stored = [annotate(m, seq, 0) for seq, m in enumerate(messages_of(rows))]
    chunks.appended(enumerate(stored))
    chunks.appended([(CHUNK, _record("red"))])  # closes chunk 0; parsed (a property)
    assert len(parsed) == 1
    red = RecordFilter([SelectorFilter(compile_selector("color = 'red'"))], fmt.properties)
    assert chunks.skip(0, CHUNK + 1, red) == CHUNK  # chunk 0 holds no color: passed over
    nothing = RecordFilter([SelectorFilter(compile_selector("color IS NULL"))], fmt.properties)
    assert chunks.skip(0, CHUNK + 1, nothing) == 0  # its records match IS NULL: read
