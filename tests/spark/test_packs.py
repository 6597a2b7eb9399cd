"""Packs: several stream records in one delivery (`scow:stream-pack`), split again by the
reader; a broker that does not pack is read as before."""

from __future__ import annotations

import pytest

from scow.plugins.spark.records import (
    PACK_ANNOTATION,
    MalformedPack,
    annotate,
    is_pack,
    pack,
    rows_in,
    unpack,
)
from scow.protocols.amqp.codec import DATA, MessageInfo, encode_message, scan_sections
from tests.spark.conftest import client, stream, wait_stream


@pytest.mark.parametrize("durable", [False, True])
def test_a_pack_is_an_amqp_message_and_unpacks_to_its_records(durable):
    records = [
        annotate(encode_message(b"x" * size), i, 1000 + i) for i, size in enumerate([0, 7, 70_000])
    ]
    packed = pack(records, durable=durable)
    info = MessageInfo(packed)
    assert info.message_annotations == {PACK_ANNOTATION: 3}
    assert info.durable is durable  # a staged pack is journaled as its rows would be
    assert is_pack(packed)
    assert scan_sections(packed).body_code == DATA
    out: list[bytes] = [b"before"]
    assert unpack(packed, out)
    assert out == [b"before", *records]


def _with_uint(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + value.to_bytes(4, "big") + data[at + 4 :]


_GOOD = pack([b"ab", b"cde"])
_COUNT_AT = _GOOD.index(b"\x00\x53\x75\xb0") - 4  # the record count, before the data section
_SIZE_AT = _COUNT_AT + 8  # the data section's size


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (_with_uint(_GOOD, _COUNT_AT, 3), "record 2 runs past its data section"),
        (_with_uint(_GOOD, _COUNT_AT, 1), "7 bytes after its last record"),
        (_with_uint(_GOOD, _COUNT_AT, 1 << 30), "cannot hold them"),
        (_with_uint(_GOOD, _SIZE_AT, 1000), "says 1000 bytes, 13 follow"),
        (_with_uint(_GOOD, _SIZE_AT + 4, 100), "record 0 runs past"),
        (_GOOD[: _COUNT_AT + 6], "too short"),
        (_with_uint(_GOOD, _COUNT_AT, 0)[:_SIZE_AT] + b"\x00" * 4, "expected 1 to"),
    ],
    ids=["count-over", "count-under", "count-huge", "section-over", "record-over", "short", "none"],
)
def test_a_pack_whose_sizes_do_not_fit_its_bytes_is_refused_saying_what(data, says):
    with pytest.raises(MalformedPack, match=says):
        rows_in(data)
    out: list[bytes] = []
    if "expected 1 to" not in says:  # a pack of no records unpacks to none
        with pytest.raises(MalformedPack, match=says):
            unpack(data, out)
    assert out == []


def test_a_record_that_is_not_a_pack_is_left_to_the_caller():
    record = annotate(encode_message(b"plain"), 5, 1005)
    out: list[bytes] = []
    assert not is_pack(record)
    assert not unpack(record, out)
    assert out == []


def test_rows_staged_in_packs_commit_as_rows_even_when_packs_are_large_messages(streams):
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from scow.plugins.spark.schema import to_batch
    from scow.plugins.spark.source import Options, commit, stage

    # packs (32 KiB) over min-large-message-size: each staged pack is a large message
    broker = streams.start({"out": stream()}, amqp={"min-large-message-size": 4096})
    options = Options.parse({"url": broker.url, "address": "out"})
    bodies = [f"r{i:05d}".encode() + b"x" * 100 for i in range(1000)]
    staged = stage(
        options, "packs", 0, iter([pa.RecordBatch.from_arrays([pa.array(bodies)], ["body"])])
    )
    commit(options, "packs", 0, [staged])
    wait_stream(broker, "out", 1000)  # committed; in the stream once its writer has them
    reader = client(broker.url)
    got = [m for batch in reader.read("out", 0, 2000, address="out") for m in batch]
    reader.close()
    assert to_batch("out", got).column("body").to_pylist() == bodies
