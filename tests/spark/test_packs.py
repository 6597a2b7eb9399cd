"""Packs: several stream records in one delivery (`scow:stream-pack`), split again by the
reader; a broker that does not pack is read as before."""

from __future__ import annotations

from scow.plugins.spark.records import PACK_ANNOTATION, annotate, pack, unpack
from scow.protocols.amqp.codec import DATA, MessageInfo, encode_message, scan_sections


def test_a_pack_is_an_amqp_message_and_unpacks_to_its_records():
    records = [
        annotate(encode_message(b"x" * size), i, 1000 + i) for i, size in enumerate([0, 7, 70_000])
    ]
    packed = pack(records)
    info = MessageInfo(packed)
    assert info.message_annotations == {PACK_ANNOTATION: 3}
    assert scan_sections(packed).body_code == DATA
    out: list[bytes] = [b"before"]
    assert unpack(packed, out)
    assert out == [b"before", *records]


def test_a_record_that_is_not_a_pack_is_left_to_the_caller():
    record = annotate(encode_message(b"plain"), 5, 1005)
    out: list[bytes] = []
    assert not unpack(record, out)
    assert out == []
