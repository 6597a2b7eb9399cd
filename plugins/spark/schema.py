"""The data source's fixed schema, and AMQP messages to and from Arrow record batches.

Reading, like the Kafka source's: `body` (binary) and `body_type` ("data": the data
sections' bytes; "string": an amqp-value string as UTF-8; "value": any other amqp-value,
AMQP-encoded; "sequence": amqp-sequence sections, AMQP-encoded; "empty": no body;
"unreadable": a message whose sections cannot be decoded, its bytes whole),
`queue`, `sequence`, `enqueued_time`, the AMQP properties as a struct, and
`application_properties` and `message_annotations` as string maps (values as text).

Writing: `body` (binary or string) and optional `to` (or `address`), `subject`,
`properties` (a struct or map of AMQP property names) and `application_properties`
(a map) columns; every message is sent durable, with the sink's `_AMQ_DUPL_ID` when it
has one.

Imports pyarrow: only Spark users import this module.
"""

from __future__ import annotations

import datetime
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from scow.core.duplicates import DUPLICATE_ID_PROPERTY
from scow.plugins.spark import records
from scow.plugins.spark.records import SEQUENCE_ANNOTATION, TIME_ANNOTATION
from scow.protocols.amqp import codec

PROPERTY_FIELDS = (
    ("message_id", pa.string()),
    ("user_id", pa.binary()),
    ("to", pa.string()),
    ("subject", pa.string()),
    ("reply_to", pa.string()),
    ("correlation_id", pa.string()),
    ("content_type", pa.string()),
    ("content_encoding", pa.string()),
    ("absolute_expiry_time", pa.timestamp("us", tz="UTC")),
    ("creation_time", pa.timestamp("us", tz="UTC")),
    ("group_id", pa.string()),
    ("group_sequence", pa.int64()),
    ("reply_to_group_id", pa.string()),
)
PROPERTIES_TYPE = pa.struct([pa.field(n, t) for n, t in PROPERTY_FIELDS])
STRING_MAP = pa.map_(pa.string(), pa.string())

ARROW_SCHEMA = pa.schema(
    [
        pa.field("body", pa.binary()),
        pa.field("body_type", pa.string()),
        pa.field("queue", pa.string()),
        pa.field("sequence", pa.int64()),
        pa.field("enqueued_time", pa.timestamp("us", tz="UTC")),
        pa.field("properties", PROPERTIES_TYPE),
        pa.field("application_properties", STRING_MAP),
        pa.field("message_annotations", STRING_MAP),
    ]
)

#: The same schema as Spark DDL (what `DataSource.schema` returns).
SCHEMA_DDL = (
    "body BINARY, body_type STRING, queue STRING, sequence BIGINT, enqueued_time TIMESTAMP, "
    "properties STRUCT<message_id: STRING, user_id: BINARY, to: STRING, subject: STRING, "
    "reply_to: STRING, correlation_id: STRING, content_type: STRING, "
    "content_encoding: STRING, absolute_expiry_time: TIMESTAMP, creation_time: TIMESTAMP, "
    "group_id: STRING, group_sequence: BIGINT, reply_to_group_id: STRING>, "
    "application_properties MAP<STRING, STRING>, message_annotations MAP<STRING, STRING>"
)

_TIME_FIELDS = (8, 9)
_ID_FIELDS = (0, 5)
_NO_PROPERTIES = (None,) * 13
_BODY_NAMES = {codec.DATA: "data", codec.AMQP_SEQUENCE: "sequence"}


def _text(value: Any) -> str | None:
    if value is None or value.__class__ is str:
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


_DATA_SECTION = b"\x00\x53\x75"


def _body(data: bytes, sections: codec.Sections) -> tuple[bytes | None, str]:
    if sections.body is None:
        return None, "empty"
    code = sections.body_code
    start, end = sections.body
    if code == codec.DATA and data.startswith(_DATA_SECTION, start):
        # one data section (the common case): its bytes, without decoding
        constructor = data[start + 3]
        head = 5 if constructor == 0xA0 else 8 if constructor == 0xB0 else 0
        if head and end - start - head == _length(data, start + 4, head - 4):
            return data[start + head : end], "data"
    spans = [(s, e) for c, s, e in sections.spans if c == code]
    if code == codec.AMQP_VALUE:
        start, end = spans[0]
        value_at = codec.skip_value(data, start + 1)  # past the descriptor
        value = codec.decode_value(data, value_at)[0]
        if isinstance(value, str) and not isinstance(value, codec.Symbol):
            return value.encode("utf-8"), "string"
        return data[value_at:end], "value"
    if code == codec.DATA:
        return b"".join(codec.decode_value(data, s)[0].value for s, _e in spans), "data"
    return b"".join(data[codec.skip_value(data, s + 1) : e] for s, e in spans), _BODY_NAMES[code]


def _length(data: bytes, at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size], "big")


def _map_array(offsets: list[int], keys: list[str], values: list[str | None]) -> pa.Array:
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.string())
    )


_HEADER_SECTION = b"\x00\x53\x70"


def _plain(messages: list[bytes]) -> tuple[list[bytes], list[int], list[int]] | None:
    """(bodies, sequence numbers, enqueue times in ms) when every message is plain: an optional
    header, the stream's own annotations and one data section, nothing else (what most
    producers send); None as soon as one is not."""
    ours, ours_size = records.STREAM_SECTION_PREFIX, records.STREAM_SECTION_SIZE
    seq_at, time_at = records.SEQUENCE_OFFSET, records.TIME_OFFSET
    unpack = records.LONG.unpack_from
    header, data_section, skip = _HEADER_SECTION, _DATA_SECTION, codec.skip_value
    bodies: list[bytes] = []
    sequences: list[int] = []
    times: list[int] = []
    for data in messages:
        at = skip(data, 3) if data.startswith(header) else 0
        if not data.startswith(ours, at):
            return None
        sequences.append(unpack(data, at + seq_at)[0])
        times.append(unpack(data, at + time_at)[0])
        at += ours_size
        if not data.startswith(data_section, at):
            return None
        constructor = data[at + 3]
        if constructor == 0xA0:
            start, size = at + 5, data[at + 4]
        elif constructor == 0xB0:
            start, size = at + 8, int.from_bytes(data[at + 4 : at + 8], "big")
        else:
            return None
        if start + size != len(data):
            return None
        bodies.append(data[start:])
    return bodies, sequences, times


def _plain_batch(
    queue: str, bodies: list[bytes], sequences: list[int], times: list[int]
) -> pa.RecordBatch:
    """`to_batch` of plain messages: no properties, no application properties, the two
    stream annotations; built a column at a time."""
    n = len(bodies)
    sequence_column = pa.array(sequences, pa.int64())
    times_ms = pa.array(times, pa.int64())
    time_column = pc.multiply(times_ms, 1000).cast(pa.timestamp("us", tz="UTC"))
    # annotation values as text, interleaved: sequence, time, sequence, time, ...
    texts = pa.concat_arrays(
        [pc.cast(sequence_column, pa.string()), pc.cast(times_ms, pa.string())]
    )
    order = pa.array([i + half for i in range(n) for half in (0, n)], pa.int64())
    annotations = pa.MapArray.from_arrays(
        pa.array(range(0, 2 * n + 1, 2), pa.int32()),
        pa.array([SEQUENCE_ANNOTATION, TIME_ANNOTATION] * n, pa.string()),
        texts.take(order),
    )
    properties = pa.StructArray.from_arrays(
        [pa.nulls(n, t) for _name, t in PROPERTY_FIELDS], fields=list(PROPERTIES_TYPE)
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(bodies, pa.binary()),
            pa.array(["data"] * n, pa.string()),
            pa.array([queue] * n, pa.string()),
            sequence_column,
            time_column,
            properties,
            _map_array([0] * (n + 1), [], []),
            annotations,
        ],
        schema=ARROW_SCHEMA,
    )


def to_batch(queue: str, messages: list[bytes]) -> pa.RecordBatch:
    """One record batch of the fixed schema from stream deliveries.

    Plain messages (see `_plain`) are sliced, not decoded. Otherwise built by column (one
    Python list per leaf field, no per-row dicts), the stream's own annotations section
    (see `records`) and a lone data section still sliced rather than decoded.
    """
    try:
        plain = _plain(messages) if messages else None
    except _UNDECODABLE:  # one is cut short where a plain one has its data section
        plain = None
    if plain is not None:
        return _plain_batch(queue, *plain)
    return _any_batch(queue, messages)


#: What reading a malformed message's bytes raises.
_UNDECODABLE = (ValueError, RecursionError, IndexError, struct.error)
#: (body, body_type, sequence, enqueue time in ms, the properties' fields, application
#: properties and message annotations as (key, text) pairs) of one message.
_Fields = tuple[
    bytes | None, str, Any, Any, tuple[Any, ...], list[tuple[str, Any]], list[tuple[str, Any]]
]


def _fields(data: bytes) -> _Fields:
    """What `_any_batch` makes of one message; ValueError when it cannot be decoded."""
    info = codec.MessageInfo(data)
    sections = info.sections
    body, kind = _body(data, sections)
    span = sections.message_annotations
    ann: list[tuple[str, Any]]
    if _ours_at(data, span[0] if span is not None else -1) and span[1] - span[0] == _OURS_SIZE:
        seq, enqueued = _ours(data, span[0])
        ann = [(SEQUENCE_ANNOTATION, str(seq)), (TIME_ANNOTATION, str(enqueued))]
    else:
        annotations = info.message_annotations
        seq = annotations.get(SEQUENCE_ANNOTATION)
        enqueued = annotations.get(TIME_ANNOTATION)
        ann = [(str(key), _text(value)) for key, value in annotations.items()]
    props = info._props() if sections.properties is not None else _NO_PROPERTIES
    app = []
    if sections.application_properties is not None:
        app = [(key, _text(value)) for key, value in info.application_properties.items()]
    return body, kind, seq, enqueued, props, app, ann


def _unreadable(data: bytes) -> _Fields:
    """A message whose sections cannot be decoded (a client sent nonsense, and the broker
    took it as bytes): its bytes whole as the body, body_type "unreadable", and the
    stream's sequence and time where the broker's section says them (`records.annotate`
    puts it after the header), so that the query goes on and can set the row aside."""
    at = data.find(records.STREAM_SECTION_PREFIX, 0, 64)
    if at >= 0 and _ours_at(data, at):
        seq, enqueued = _ours(data, at)
    else:  # merged into annotations of the message's own: each read after its key
        seq, enqueued = _value_after(data, _SEQUENCE_KEY), _value_after(data, _TIME_KEY)
    if seq is None:
        return data, "unreadable", None, None, _NO_PROPERTIES, [], []
    ann = [(SEQUENCE_ANNOTATION, str(seq)), (TIME_ANNOTATION, str(enqueued))]
    return data, "unreadable", seq, enqueued, _NO_PROPERTIES, [], ann


_SEQUENCE_KEY = codec.encode_value(codec.Symbol(SEQUENCE_ANNOTATION))
_TIME_KEY = codec.encode_value(codec.Symbol(TIME_ANNOTATION))


def _value_after(data: bytes, key: bytes) -> Any:
    """The integer encoded right after the first `key` in `data`, if any."""
    at = data.find(key)
    if at < 0:
        return None
    try:
        value = codec.decode_value(data, at + len(key))[0]
    except _UNDECODABLE:
        return None
    return int(value) if isinstance(value, int) else None


_OURS_SIZE = records.STREAM_SECTION_SIZE


def _ours_at(data: bytes, at: int) -> bool:
    """Whether the stream's own section (`records.annotate`) starts at `at`."""
    return (
        at >= 0
        and data.startswith(records.STREAM_SECTION_PREFIX, at)
        and (at + _OURS_SIZE <= len(data))
    )


def _ours(data: bytes, at: int) -> tuple[int, int]:
    """(sequence, enqueue time) from the stream's own section at `at`."""
    unpack = records.LONG.unpack_from
    return unpack(data, at + records.SEQUENCE_OFFSET)[0], unpack(data, at + records.TIME_OFFSET)[0]


def _any_batch(queue: str, messages: list[bytes]) -> pa.RecordBatch:
    """`to_batch` of messages of any layout."""
    bodies: list[bytes | None] = []
    kinds: list[str] = []
    sequences: list[int | None] = []
    times: list[int | None] = []
    prop_rows: list[tuple[Any, ...]] = []
    app_offsets: list[int] = [0]
    app_keys: list[str] = []
    app_values: list[str | None] = []
    ann_offsets: list[int] = [0]
    ann_keys: list[str] = []
    ann_values: list[str | None] = []
    for data in messages:
        try:
            body, kind, seq, enqueued, props, app, ann = _fields(data)
        except _UNDECODABLE:
            body, kind, seq, enqueued, props, app, ann = _unreadable(data)
        bodies.append(body)
        kinds.append(kind)
        sequences.append(seq)
        times.append(enqueued * 1000 if enqueued is not None else None)
        prop_rows.append(props)
        for key, value in app:
            app_keys.append(key)
            app_values.append(value)
        app_offsets.append(len(app_keys))
        for key, value in ann:
            ann_keys.append(key)
            ann_values.append(value)
        ann_offsets.append(len(ann_keys))
    props = (
        [list(column) for column in zip(*prop_rows, strict=True)]
        if prop_rows
        else [[] for _ in PROPERTY_FIELDS]
    )
    for i in _ID_FIELDS:
        props[i] = [_text(v) for v in props[i]]
    for i in _TIME_FIELDS:
        props[i] = [v * 1000 if v is not None else None for v in props[i]]
    properties = pa.StructArray.from_arrays(
        [pa.array(column, t) for column, (_n, t) in zip(props, PROPERTY_FIELDS, strict=True)],
        fields=list(PROPERTIES_TYPE),
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(bodies, pa.binary()),
            pa.array(kinds, pa.string()),
            pa.array([queue] * len(messages), pa.string()),
            pa.array(sequences, pa.int64()),
            pa.array(times, pa.timestamp("us", tz="UTC")),
            properties,
            _map_array(app_offsets, app_keys, app_values),
            _map_array(ann_offsets, ann_keys, ann_values),
        ],
        schema=ARROW_SCHEMA,
    )


# --------------------------------------------------------------------------- writing

WRITE_COLUMNS = ("body", "to", "address", "subject", "properties", "application_properties")
_WRITABLE_PROPERTIES = {n for n, _t in PROPERTY_FIELDS}


def _plain_property(name: str, value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    if name in ("message_id", "correlation_id") and isinstance(value, uuid.UUID):
        return value
    return value


def check_write_schema(names: list[str], key_column: str | None = None) -> None:
    """ValueError naming a column the writer cannot map, or a missing body. `key_column`
    (the sink's keyColumn) is accepted too: it picks a broker, and is written only when it
    is one of WRITE_COLUMNS."""
    if "body" not in names:
        raise ValueError(f"writing to scow needs a 'body' column (got: {', '.join(names)})")
    if key_column is not None and key_column not in names:
        raise ValueError(
            f"option keyColumn = {key_column!r}: no such column (columns: {', '.join(names)})"
        )
    unknown = [n for n in names if n not in WRITE_COLUMNS and n != key_column]
    if unknown:
        accepted = ", ".join(WRITE_COLUMNS)
        raise ValueError(f"column {unknown[0]!r} cannot be written to scow (accepted: {accepted})")


_PACK_SIZE = struct.Struct(">I").pack


def _binary(data: bytes) -> bytes:
    size = len(data)
    return (b"\xa0" + bytes((size,)) if size <= 0xFF else b"\xb0" + _PACK_SIZE(size)) + data


def _duplicate_id_section(value: str) -> bytes:
    """The application-properties section {_AMQ_DUPL_ID: value}, encoded as the codec does
    (laid out as `records.id_value_at` reads it)."""
    raw = value.encode("utf-8")
    size = len(raw)
    value_head = b"\xa1" + bytes((size,)) if size <= 0xFF else b"\xb1" + _PACK_SIZE(size)
    length = len(records.ID_KEY) + len(value_head) + size
    if length + 1 <= 0xFF:
        head = records.ID_ROW + bytes((length + 1,)) + records.ID_NAME
    else:
        head = records.APPLICATION_PROPERTIES + b"\xd1" + _PACK_SIZE(length + 4) + _PACK_SIZE(2)
        head += records.ID_KEY
    return head + value_head + raw


def _bodies_only(bodies: list[Any], duplicate_ids: str | None, first_row: int) -> Iterator[bytes]:
    """`messages_of` for rows that are a body and nothing else (the common case), encoded
    from fixed parts instead of through encode_message's general path."""
    header = records.DURABLE_HEADER
    for i, body in enumerate(bodies):
        if body is None:
            body = b""
        elif body.__class__ is str:
            body = body.encode("utf-8")
        ids = _duplicate_id_section(f"{duplicate_ids}{first_row + i}") if duplicate_ids else b""
        yield header + ids + records.BODY_ROW + _binary(body)


def messages_of(
    batch: pa.RecordBatch, duplicate_ids: str | None = None, first_row: int = 0
) -> Iterator[bytes]:
    """The AMQP messages of one record batch to write (see the module docstring).

    With `duplicate_ids`, row i of the batch carries `_AMQ_DUPL_ID` = that prefix followed
    by `first_row + i`: the broker keeps a row once however often it is sent. Columns not
    in WRITE_COLUMNS (a key column) are not written.
    """
    names = [name for name in batch.schema.names if name in WRITE_COLUMNS]
    if names == ["body"]:
        yield from _bodies_only(batch.column("body").to_pylist(), duplicate_ids, first_row)
        return
    columns = {name: batch.column(name).to_pylist() for name in names}
    n = batch.num_rows
    none = [None] * n
    to = columns.get("to") or columns.get("address") or none
    subject = columns.get("subject") or none
    properties = columns.get("properties") or none
    application = columns.get("application_properties") or none
    for i, body in enumerate(columns["body"]):
        props: dict[str, Any] = {}
        given = properties[i]
        if given:
            items = given.items() if isinstance(given, dict) else given
            for name, value in items:
                if name not in _WRITABLE_PROPERTIES:
                    raise ValueError(
                        f"properties.{name}: not an AMQP property "
                        f"(accepted: {', '.join(sorted(_WRITABLE_PROPERTIES))})"
                    )
                if value is not None:
                    props[name] = _plain_property(name, value)
        if to[i]:
            props["to"] = to[i]
        if subject[i]:
            props["subject"] = subject[i]
        app = application[i]
        if app and not isinstance(app, dict):
            app = dict(app)
        if duplicate_ids is not None:
            app = {**(app or {}), DUPLICATE_ID_PROPERTY: f"{duplicate_ids}{first_row + i}"}
        yield codec.encode_message(
            body if body is not None else b"",
            durable=True,
            properties=props or None,
            application_properties=app or None,
        )
