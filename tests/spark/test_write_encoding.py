"""Messages to and from record batches: the fast paths (body-only rows written, plain stream
records read) give exactly what the general ones give. A body-only row is encoded byte
for byte as the codec encodes it; its duplicate id counts the rows of the task."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

from scow.core.duplicates import DUPLICATE_ID_PROPERTY  # noqa: E402
from scow.plugins.spark.schema import messages_of  # noqa: E402
from scow.protocols.amqp.codec import MessageInfo, encode_message  # noqa: E402


@pytest.mark.parametrize("size", [0, 1, 255, 256, 70_000])
@pytest.mark.parametrize("prefix", [None, "query-1:0:3:", "s" * 240, "s" * 300])
def test_body_only_rows_encode_as_the_codec_does(size, prefix):
    batch = pa.RecordBatch.from_arrays([pa.array([b"x" * size, None, b"text"])], ["body"])
    got = list(messages_of(batch, prefix, 7))
    expected = [
        encode_message(
            body if body is not None else b"",
            durable=True,
            application_properties={DUPLICATE_ID_PROPERTY: f"{prefix}{7 + i}"} if prefix else None,
        )
        for i, body in enumerate(batch.column("body").to_pylist())
    ]
    assert got == expected


def test_a_key_column_is_not_written_and_other_columns_take_the_general_path():
    batch = pa.RecordBatch.from_pylist(
        [{"body": b"a", "key": "k", "subject": "s"}, {"body": b"b", "key": "k", "subject": None}]
    )
    first, second = messages_of(batch, "sink:0:0:")
    info = MessageInfo(first)
    assert info.subject == "s"
    assert info.application_properties == {DUPLICATE_ID_PROPERTY: "sink:0:0:0"}
    assert MessageInfo(second).application_properties == {DUPLICATE_ID_PROPERTY: "sink:0:0:1"}
    assert "key" not in info.application_properties and b"\xa1\x01k" not in first


def test_a_string_body_column_is_sent_as_its_utf8_bytes():
    batch = pa.RecordBatch.from_arrays([pa.array(["héllo", None])], ["body"])
    assert list(messages_of(batch)) == [
        encode_message("héllo".encode(), durable=True),
        encode_message(b"", durable=True),
    ]


def test_plain_stream_records_are_read_as_the_general_path_reads_them():
    from scow.plugins.spark.records import annotate
    from scow.plugins.spark.schema import _any_batch, _plain, to_batch

    plain = [
        annotate(encode_message(b"x" * size, durable=durable), seq, 1_700_000_000_000 + seq)
        for seq, (size, durable) in enumerate(
            [(0, False), (100, True), (300, False), (70_000, True)]
        )
    ]
    assert _plain(plain) is not None
    assert to_batch("q", plain).equals(_any_batch("q", plain))
    # one message with more than a body: the whole batch takes the general path, the same
    mixed = [*plain, annotate(encode_message(b"y", properties={"subject": "s"}), 9, 9)]
    assert _plain(mixed) is None
    assert to_batch("q", mixed).to_pylist()[:4] == to_batch("q", plain).to_pylist()
